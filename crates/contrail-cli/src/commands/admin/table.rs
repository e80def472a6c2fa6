//! A plain text table: columns two spaces apart, aligned by characters, no borders.

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Align {
    Left,
    Right,
}

/// A text table: every column as wide as its widest cell, two spaces between columns.
pub(super) struct Table {
    headers: Vec<&'static str>,
    alignments: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(super) fn new(columns: &[(&'static str, Align)]) -> Table {
        Table {
            headers: columns.iter().map(|(header, _)| *header).collect(),
            alignments: columns.iter().map(|(_, align)| *align).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; it must have one cell per column.
    pub(super) fn push(&mut self, row: Vec<String>) {
        debug_assert_eq!(
            row.len(),
            self.headers.len(),
            "a table row needs one cell per column"
        );
        self.rows.push(row);
    }

    /// The header line and one line per row, without trailing spaces or a final newline.
    pub(super) fn render(&self) -> String {
        let header_cells: Vec<String> = self.headers.iter().map(|header| (*header).to_owned()).collect();
        let lines: Vec<&Vec<String>> = std::iter::once(&header_cells).chain(&self.rows).collect();
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|column| {
                lines
                    .iter()
                    .map(|cells| cells.get(column).map_or(0, |cell| cell.chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        lines
            .iter()
            .map(|cells| {
                let padded: Vec<String> = widths
                    .iter()
                    .zip(&self.alignments)
                    .enumerate()
                    .map(|(column, (&width, align))| {
                        let cell = cells.get(column).map_or("", String::as_str);
                        match align {
                            Align::Left => format!("{cell:<width$}"),
                            Align::Right => format!("{cell:>width$}"),
                        }
                    })
                    .collect();
                padded.join("  ").trim_end().to_owned()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_columns_align() {
        let mut table = Table::new(&[
            ("STAGE", Align::Left),
            ("LAG", Align::Right),
            ("NOTE", Align::Left),
        ]);
        table.push(vec!["dedup-state".to_owned(), "7".to_owned(), "ok".to_owned()]);
        table.push(vec!["ingest".to_owned(), "12345".to_owned(), String::new()]);
        let rendered = table.render();
        let lines: Vec<&str> = rendered.lines().collect();
        assert_eq!(
            lines,
            [
                "STAGE          LAG  NOTE",
                "dedup-state      7  ok",
                "ingest       12345",
            ]
        );
        // Right-aligned cells end in the same column.
        let lag_end = lines[0].find("LAG").expect("header") + "LAG".len();
        assert_eq!(&lines[1][lag_end - 1..lag_end], "7");
        assert_eq!(&lines[2][lag_end - 5..lag_end], "12345");
    }

    #[test]
    fn table_measures_characters_not_bytes() {
        let mut table = Table::new(&[("A", Align::Left), ("B", Align::Left)]);
        table.push(vec!["µµ".to_owned(), "x".to_owned()]);
        table.push(vec!["ab".to_owned(), "y".to_owned()]);
        assert_eq!(table.render(), "A   B\nµµ  x\nab  y");
    }
}
