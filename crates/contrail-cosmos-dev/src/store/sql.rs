//! The part of the Cosmos DB SQL dialect contrail's clients send:
//! `SELECT * | SELECT c.a, c.b FROM c [WHERE c.x = <value> [AND …]]`, where a value is a
//! `@parameter`, a string in single or double quotes, a number, `true`, `false` or `null`.
//! Anything else is refused with the reason, rather than answered wrongly.

use serde_json::{Map, Value};

/// A parsed query.
#[derive(Debug, Clone, PartialEq)]
pub struct Select {
    /// `None` for `*`, else the projected property paths (each a list of property names).
    pub columns: Option<Vec<Vec<String>>>,
    /// Conjunction of `path = value`.
    pub conditions: Vec<(Vec<String>, Value)>,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Text(String),
    Number(f64),
    Parameter(String),
    Star,
    Comma,
    Dot,
    Equals,
}

fn tokens(sql: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = sql.char_indices().peekable();
    while let Some((start, ch)) = chars.next() {
        match ch {
            c if c.is_whitespace() => {}
            '*' => out.push(Token::Star),
            ',' => out.push(Token::Comma),
            '.' => out.push(Token::Dot),
            '=' => out.push(Token::Equals),
            '\'' | '"' => {
                let mut text = String::new();
                let mut closed = false;
                while let Some((_, next)) = chars.next() {
                    if next == '\\' {
                        if let Some((_, escaped)) = chars.next() {
                            text.push(escaped);
                        }
                    } else if next == ch {
                        closed = true;
                        break;
                    } else {
                        text.push(next);
                    }
                }
                if !closed {
                    return Err(format!("unterminated string starting at byte {start}"));
                }
                out.push(Token::Text(text));
            }
            '@' => {
                let mut name = String::from("@");
                while let Some(&(_, next)) = chars.peek() {
                    if next.is_alphanumeric() || next == '_' {
                        name.push(next);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push(Token::Parameter(name));
            }
            c if c.is_ascii_digit() || c == '-' => {
                let mut number = String::from(c);
                while let Some(&(_, next)) = chars.peek() {
                    if next.is_ascii_digit() || next == '.' || next == 'e' || next == 'E' {
                        number.push(next);
                        chars.next();
                    } else {
                        break;
                    }
                }
                let value = number
                    .parse::<f64>()
                    .map_err(|_| format!("bad number {number:?}"))?;
                out.push(Token::Number(value));
            }
            c if c.is_alphabetic() || c == '_' => {
                let mut word = String::from(c);
                while let Some(&(_, next)) = chars.peek() {
                    if next.is_alphanumeric() || next == '_' {
                        word.push(next);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push(Token::Word(word));
            }
            other => return Err(format!("unexpected {other:?} at byte {start}")),
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn keyword(&mut self, word: &str) -> Result<(), String> {
        match self.next() {
            Some(Token::Word(found)) if found.eq_ignore_ascii_case(word) => Ok(()),
            other => Err(format!("expected {word}, found {other:?}")),
        }
    }

    fn word(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Token::Word(word)) => Ok(word),
            other => Err(format!("expected a name, found {other:?}")),
        }
    }

    /// `alias.prop[.prop…]`; the alias is checked once the FROM clause is read.
    fn path(&mut self) -> Result<(String, Vec<String>), String> {
        let alias = self.word()?;
        let mut properties = Vec::new();
        while self.peek() == Some(&Token::Dot) {
            self.next();
            properties.push(self.word()?);
        }
        if properties.is_empty() {
            return Err(format!("expected {alias}.property"));
        }
        Ok((alias, properties))
    }

    fn value(&mut self, parameters: &Map<String, Value>) -> Result<Value, String> {
        match self.next() {
            Some(Token::Text(text)) => Ok(Value::String(text)),
            Some(Token::Number(number)) => Ok(serde_json::Number::from_f64(number)
                .map(Value::Number)
                .unwrap_or(Value::Null)),
            Some(Token::Parameter(name)) => parameters
                .get(&name)
                .cloned()
                .ok_or_else(|| format!("parameter {name} has no value")),
            Some(Token::Word(word)) if word.eq_ignore_ascii_case("true") => Ok(Value::Bool(true)),
            Some(Token::Word(word)) if word.eq_ignore_ascii_case("false") => Ok(Value::Bool(false)),
            Some(Token::Word(word)) if word.eq_ignore_ascii_case("null") => Ok(Value::Null),
            other => Err(format!("expected a value, found {other:?}")),
        }
    }
}

/// Parses `sql` with its parameters (`{"@name": value}`).
pub fn parse(sql: &str, parameters: &Map<String, Value>) -> Result<Select, String> {
    let unsupported = |reason: String| {
        format!(
            "cosmos-dev answers only SELECT * | SELECT c.a, … FROM c [WHERE c.x = value AND …]: {reason} in {sql:?}"
        )
    };
    let mut parser = Parser {
        tokens: tokens(sql).map_err(unsupported)?,
        at: 0,
    };
    parser.keyword("SELECT").map_err(unsupported)?;
    let mut aliases = Vec::new();
    let columns = if parser.peek() == Some(&Token::Star) {
        parser.next();
        None
    } else {
        let mut columns = Vec::new();
        loop {
            let (alias, path) = parser.path().map_err(unsupported)?;
            aliases.push(alias);
            columns.push(path);
            if parser.peek() == Some(&Token::Comma) {
                parser.next();
            } else {
                break;
            }
        }
        Some(columns)
    };
    parser.keyword("FROM").map_err(unsupported)?;
    let from = parser.word().map_err(unsupported)?;
    let mut conditions = Vec::new();
    if parser.peek().is_some() {
        parser.keyword("WHERE").map_err(unsupported)?;
        loop {
            let (alias, path) = parser.path().map_err(unsupported)?;
            aliases.push(alias);
            match parser.next() {
                Some(Token::Equals) => {}
                other => return Err(unsupported(format!("expected =, found {other:?}"))),
            }
            let value = parser.value(parameters).map_err(unsupported)?;
            conditions.push((path, value));
            match parser.peek() {
                None => break,
                Some(_) => parser.keyword("AND").map_err(unsupported)?,
            }
        }
    }
    if let Some(alias) = aliases.iter().find(|alias| **alias != from) {
        return Err(unsupported(format!("{alias} is not the FROM alias {from}")));
    }
    Ok(Select { columns, conditions })
}

fn lookup<'a>(document: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter()
        .try_fold(document, |value, property| value.get(property))
}

fn equal(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::Number(left), Value::Number(right)) => left.as_f64() == right.as_f64(),
        _ => left == right,
    }
}

impl Select {
    /// Whether a document satisfies the WHERE clause (an absent property equals nothing).
    pub fn matches(&self, document: &Value) -> bool {
        self.conditions
            .iter()
            .all(|(path, value)| lookup(document, path).is_some_and(|found| equal(found, value)))
    }

    /// The row for a matching document: the projection, or `None` for `SELECT *` (the document
    /// as stored). Absent properties are left out, as Cosmos leaves out undefined values.
    pub fn project(&self, document: &Value) -> Option<Value> {
        let columns = self.columns.as_ref()?;
        let mut row = Map::new();
        for path in columns {
            if let (Some(name), Some(value)) = (path.last(), lookup(document, path)) {
                row.insert(name.clone(), value.clone());
            }
        }
        Some(Value::Object(row))
    }

    /// Whether the query reads documents at all beyond their presence (`SELECT *` without WHERE
    /// needs no parsing of the stored body).
    pub fn needs_document(&self) -> bool {
        self.columns.is_some() || !self.conditions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn no_parameters() -> Map<String, Value> {
        Map::new()
    }

    #[test]
    fn the_queries_contrail_sends_parse() {
        let all = parse("SELECT * FROM c", &no_parameters()).expect("select all");
        assert_eq!(all.columns, None);
        assert!(all.conditions.is_empty());
        assert!(!all.needs_document());

        let ids = parse("SELECT c.id, c.version FROM c", &no_parameters()).expect("projection");
        assert_eq!(
            ids.columns,
            Some(vec![vec!["id".to_owned()], vec!["version".to_owned()]])
        );

        let leases =
            parse("SELECT * FROM c WHERE c.container = 'flights'", &no_parameters()).expect("literal");
        assert_eq!(
            leases.conditions,
            vec![(vec!["container".to_owned()], json!("flights"))]
        );

        let mut parameters = Map::new();
        parameters.insert("@date".to_owned(), json!("2013-01-01"));
        parameters.insert("@origin".to_owned(), json!("JFK"));
        let filtered = parse(
            "select * from c where c.serviceDate = @date and c.origin = @origin",
            &parameters,
        )
        .expect("parameters");
        assert_eq!(filtered.conditions.len(), 2);
        assert!(filtered.matches(&json!({"serviceDate": "2013-01-01", "origin": "JFK"})));
        assert!(!filtered.matches(&json!({"serviceDate": "2013-01-01", "origin": "LGA"})));
        assert!(!filtered.matches(&json!({"serviceDate": "2013-01-01"})));
    }

    #[test]
    fn projections_leave_out_absent_properties() {
        let ids = parse("SELECT c.id, c.version FROM c", &no_parameters()).expect("projection");
        assert_eq!(
            ids.project(&json!({"id": "a", "version": 3, "other": 1})),
            Some(json!({"id": "a", "version": 3}))
        );
        assert_eq!(ids.project(&json!({"id": "b"})), Some(json!({"id": "b"})));
        let nested = parse("SELECT c.a.b FROM c WHERE c.n = 2", &no_parameters()).expect("nested");
        assert!(nested.matches(&json!({"n": 2.0})));
        assert_eq!(nested.project(&json!({"a": {"b": 1}})), Some(json!({"b": 1})));
    }

    #[test]
    fn what_it_cannot_answer_is_refused_with_the_reason() {
        for sql in [
            "SELECT VALUE COUNT(1) FROM c",
            "SELECT * FROM c ORDER BY c.id",
            "SELECT * FROM c WHERE c.a > 1",
            "SELECT d.id FROM c",
            "SELECT * FROM c WHERE c.a = @missing",
            "SELECT * FROM c WHERE c.a = 'open",
            "DELETE FROM c",
        ] {
            let error = parse(sql, &no_parameters()).expect_err(sql);
            assert!(error.contains("cosmos-dev answers only"), "{error}");
        }
    }
}
