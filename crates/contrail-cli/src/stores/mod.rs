//! Reading the serving store (Cosmos DB `flights`) and the history (Delta tables) for the board,
//! `contrail flights` and the checks of `contrail up`.

pub(crate) mod archived;

use std::collections::HashMap;

use anyhow::{Context, Result};
use chrono::NaiveDate;
use contrail_history::Table;
use contrail_history::arrow::array::{Array, AsArray, BinaryArray, Int32Array, Int64Array, StringArray};
use contrail_history::arrow::datatypes::DataType;
use contrail_history::arrow::record_batch::RecordBatch;
use contrail_history::reader::{Scan, scan};
use futures::StreamExt as _;
use prost::Message as _;
use serde_json::Value;

use crate::check::Observed;

/// Which flights to list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct FlightFilter {
    /// Service date `YYYY-MM-DD`.
    pub date: Option<String>,
    /// Departures from this airport (IATA).
    pub origin: Option<String>,
    /// Arrivals at this airport (IATA).
    pub destination: Option<String>,
    /// Carrier code.
    pub carrier: Option<String>,
}

impl FlightFilter {
    /// The Cosmos SQL query and its parameters.
    pub fn query(&self) -> (String, Vec<(&'static str, String)>) {
        let mut clauses = Vec::new();
        let mut parameters = Vec::new();
        for (field, name, value) in [
            ("serviceDate", "@date", &self.date),
            ("origin", "@origin", &self.origin),
            ("destination", "@destination", &self.destination),
            ("carrier", "@carrier", &self.carrier),
        ] {
            if let Some(value) = value.as_deref().map(str::trim).filter(|value| !value.is_empty()) {
                clauses.push(format!("c.{field} = {name}"));
                parameters.push((name, value.to_uppercase()));
            }
        }
        let mut sql = "SELECT * FROM c".to_owned();
        if !clauses.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&clauses.join(" AND "));
        }
        (sql, parameters)
    }
}

/// The stores of a platform.
#[derive(Clone)]
pub struct Stores {
    containers: contrail_cosmos::Containers,
    delta_root: String,
}

/// Cosmos system properties (`_rid`, `_etag`, `_lsn`, …) are not part of a flight.
fn without_system_properties(mut document: Value) -> Value {
    if let Some(object) = document.as_object_mut() {
        object.retain(|key, _| !key.starts_with('_'));
    }
    document
}

impl Stores {
    /// Connects to Cosmos (creating nothing) and remembers the Delta root.
    pub async fn open(cosmos: &contrail_cosmos::CosmosConfig, delta_root: &str) -> Result<Stores> {
        let containers = cosmos
            .open("contrail-cli")
            .await
            .with_context(|| format!("opening Cosmos DB at {}", cosmos.endpoint))?;
        Ok(Stores {
            containers,
            delta_root: delta_root.to_owned(),
        })
    }

    /// Flights matching `filter`, sorted by scheduled departure, at most `limit`.
    pub async fn flights(&self, filter: &FlightFilter, limit: usize) -> Result<Vec<Value>> {
        let (sql, parameters) = filter.query();
        let mut query = azure_data_cosmos::Query::from(sql);
        for (name, value) in parameters {
            query = query.with_parameter(name, value)?;
        }
        let mut items = self
            .containers
            .flights
            .query_items::<Value>(query, azure_data_cosmos::FeedScope::full_container(), None)
            .await
            .context("querying Cosmos DB flights")?;
        let mut flights = Vec::new();
        while let Some(item) = items.next().await {
            flights.push(without_system_properties(item.context("reading a query page")?));
        }
        flights.sort_by(|a, b| {
            let key = |flight: &Value| {
                (
                    flight["scheduledOut"].as_str().unwrap_or_default().to_owned(),
                    flight["id"].as_str().unwrap_or_default().to_owned(),
                )
            };
            key(a).cmp(&key(b))
        });
        flights.truncate(limit);
        Ok(flights)
    }

    /// Every document's (id, version).
    pub async fn versions(&self) -> Result<Vec<(String, i64)>> {
        let mut items = self
            .containers
            .flights
            .query_items::<Value>(
                "SELECT c.id, c.version FROM c",
                azure_data_cosmos::FeedScope::full_container(),
                None,
            )
            .await
            .context("querying Cosmos DB flights")?;
        let mut versions = Vec::new();
        while let Some(item) = items.next().await {
            let item = item.context("reading a query page")?;
            versions.push((
                item["id"].as_str().unwrap_or_default().to_owned(),
                item["version"].as_i64().unwrap_or_default(),
            ));
        }
        Ok(versions)
    }

    /// One flight's document, `None` when there is none.
    pub async fn flight(&self, key: &str) -> Result<Option<Value>> {
        match self.containers.flights.read_item(key.to_owned(), key, None).await {
            Ok(response) => Ok(Some(without_system_properties(response.into_model()?))),
            Err(error) if u16::from(error.status().status_code()) == 404 => Ok(None),
            Err(error) => Err(error).with_context(|| format!("reading flight {key} from Cosmos DB")),
        }
    }

    /// Every row of the Delta `alerts` table (raised and resolved), decoded from its record.
    pub async fn alerts(&self) -> Result<Vec<contrail_proto::v1::Alert>> {
        let scan = scan(
            &self.delta_root,
            &HashMap::new(),
            Table::Alerts,
            None,
            &["record"],
        )
        .await?;
        let mut alerts = Vec::new();
        for batch in scan.batches() {
            let records = records(batch, "alerts")?;
            for row in 0..records.len() {
                alerts.push(
                    contrail_proto::v1::Alert::decode(records.value(row))
                        .context("an alerts record is not an Alert")?,
                );
            }
        }
        Ok(alerts)
    }

    /// A flight's states from the Delta `flight_states` table, by version.
    pub async fn history(&self, key: &str) -> Result<Vec<Value>> {
        let date = service_date(key)?;
        let scan = scan(
            &self.delta_root,
            &HashMap::new(),
            Table::FlightStates,
            Some(date),
            &["flight_key", "version", "record"],
        )
        .await?;
        let mut states = Vec::new();
        for batch in scan.batches() {
            let keys = strings(batch, "flight_key")?;
            let records = records(batch, "flight_states")?;
            for (row, row_key) in keys.iter().enumerate() {
                if row_key.as_deref() != Some(key) {
                    continue;
                }
                let state = contrail_proto::v1::FlightState::decode(records.value(row))
                    .context("a flight_states record is not a FlightState")?;
                states.push(contrail_flight::document::flight_document(&state));
            }
        }
        states.sort_by_key(|state| state["version"].as_i64().unwrap_or_default());
        states.dedup_by_key(|state| state["version"].as_i64().unwrap_or_default());
        Ok(states)
    }

    /// What the exactly-once checks compare from the Delta tables; `documents` is left empty
    /// (fill it with [`Stores::versions`]: a query over the whole container, the expensive part).
    pub async fn observe_history(&self) -> Result<Observed> {
        let root = &self.delta_root;
        let none = HashMap::new();
        let events = scan(root, &none, Table::Events, None, &["flight_key", "event_id"]).await?;
        let late = scan(
            root,
            &none,
            Table::LateEvents,
            None,
            &["flight_key", "event_id", "input_partition", "input_offset"],
        )
        .await?;
        let states = scan(root, &none, Table::FlightStates, None, &["flight_key", "version"]).await?;
        let changes = scan(
            root,
            &none,
            Table::ServingChanges,
            None,
            &["id", "lsn", "version"],
        )
        .await?;
        let alerts = scan(root, &none, Table::Alerts, None, &["alert_id", "state"]).await?;
        let mut observed = Observed::default();
        for batch in alerts.batches() {
            for (id, state) in strings(batch, "alert_id")?
                .into_iter()
                .zip(strings(batch, "state")?)
            {
                observed
                    .alerts
                    .push((id.unwrap_or_default(), state.unwrap_or_default()));
            }
        }
        for batch in events.batches() {
            for (key, id) in strings(batch, "flight_key")?
                .into_iter()
                .zip(strings(batch, "event_id")?)
            {
                observed
                    .events
                    .push((key.unwrap_or_default(), id.unwrap_or_default()));
            }
        }
        for batch in late.batches() {
            let keys = strings(batch, "flight_key")?;
            let ids = strings(batch, "event_id")?;
            let partitions = ints(batch, "input_partition")?;
            let offsets = longs(batch, "input_offset")?;
            for row in 0..batch.num_rows() {
                observed.late.push((
                    keys[row].clone().unwrap_or_default(),
                    ids[row].clone().unwrap_or_default(),
                    partitions[row].unwrap_or(-1),
                    offsets[row].unwrap_or(-1),
                ));
            }
        }
        for batch in states.batches() {
            for (key, version) in strings(batch, "flight_key")?
                .into_iter()
                .zip(longs(batch, "version")?)
            {
                observed
                    .states
                    .push((key.unwrap_or_default(), version.unwrap_or(0)));
            }
        }
        for batch in changes.batches() {
            let ids = strings(batch, "id")?;
            let lsns = longs(batch, "lsn")?;
            let versions = longs(batch, "version")?;
            for row in 0..batch.num_rows() {
                observed.changes.push((
                    ids[row].clone().unwrap_or_default(),
                    lsns[row].unwrap_or(0),
                    versions[row],
                ));
            }
        }
        Ok(observed)
    }

    /// When the newest file of `table` was committed (ms since the epoch; `None` while the table
    /// is empty): read from the Delta log, so it says when the rows became readable, not when
    /// someone looked.
    pub async fn last_commit_ms(&self, table: Table, column: &str) -> Result<Option<i64>> {
        let scan = scan(&self.delta_root, &HashMap::new(), table, None, &[column]).await?;
        Ok(scan.files.iter().map(|file| file.added_at_ms).max())
    }

    /// The `events` table's scan with ingestion times (for the pipeline benchmark).
    pub async fn scan_events(&self, columns: &[&str]) -> Result<Scan> {
        Ok(scan(&self.delta_root, &HashMap::new(), Table::Events, None, columns).await?)
    }
}

/// The service date in a flight key `{carrier}{number}-{YYYY-MM-DD}-{origin}`.
pub fn service_date(key: &str) -> Result<NaiveDate> {
    let parts: Vec<&str> = key.rsplitn(5, '-').collect();
    // rsplitn from the right: origin, day, month, year, carrier+number.
    if parts.len() == 5 {
        let text = format!("{}-{}-{}", parts[3], parts[2], parts[1]);
        if let Ok(date) = NaiveDate::parse_from_str(&text, "%Y-%m-%d") {
            return Ok(date);
        }
    }
    anyhow::bail!("{key:?} is not a flight key (expected e.g. UA1545-2013-01-01-EWR)")
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a dyn Array> {
    batch
        .column_by_name(name)
        .map(|column| column.as_ref())
        .with_context(|| format!("no column {name}"))
}

/// A string column as owned values (Utf8, LargeUtf8 or Utf8View).
pub fn strings(batch: &RecordBatch, name: &str) -> Result<Vec<Option<String>>> {
    let array = column(batch, name)?;
    let values = match array.data_type() {
        DataType::Utf8 => collect_strings(
            array
                .as_any()
                .downcast_ref::<StringArray>()
                .context(name.to_owned())?,
        ),
        DataType::LargeUtf8 => array
            .as_string::<i64>()
            .iter()
            .map(|value| value.map(str::to_owned))
            .collect(),
        DataType::Utf8View => array
            .as_string_view()
            .iter()
            .map(|value| value.map(str::to_owned))
            .collect(),
        other => anyhow::bail!("column {name} is {other}, not a string"),
    };
    Ok(values)
}

fn collect_strings(array: &StringArray) -> Vec<Option<String>> {
    array.iter().map(|value| value.map(str::to_owned)).collect()
}

/// The binary `record` column (the encoded protobuf message) of a batch of `table`.
pub fn records<'a>(batch: &'a RecordBatch, table: &str) -> Result<&'a BinaryArray> {
    batch
        .column_by_name("record")
        .and_then(|column| column.as_any().downcast_ref::<BinaryArray>())
        .with_context(|| format!("{table} has no binary column `record`"))
}

/// An Int64 column.
pub fn longs(batch: &RecordBatch, name: &str) -> Result<Vec<Option<i64>>> {
    let array = column(batch, name)?
        .as_any()
        .downcast_ref::<Int64Array>()
        .with_context(|| format!("column {name} is not Int64"))?;
    Ok(array.iter().collect())
}

/// An Int32 column.
pub fn ints(batch: &RecordBatch, name: &str) -> Result<Vec<Option<i32>>> {
    let array = column(batch, name)?
        .as_any()
        .downcast_ref::<Int32Array>()
        .with_context(|| format!("column {name} is not Int32"))?;
    Ok(array.iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_date_is_read_from_the_key() {
        assert_eq!(
            service_date("UA1545-2013-01-01-EWR").expect("key"),
            NaiveDate::from_ymd_opt(2013, 1, 1).expect("date")
        );
        assert_eq!(
            service_date("B61-2013-12-31-JFK").expect("key"),
            NaiveDate::from_ymd_opt(2013, 12, 31).expect("date")
        );
        let error = service_date("UA1545").expect_err("not a key").to_string();
        assert!(error.contains("\"UA1545\""), "{error}");
        assert!(service_date("UA1-2013-13-01-EWR").is_err());
    }

    #[test]
    fn filters_become_a_parameterised_query() {
        let (sql, parameters) = FlightFilter::default().query();
        assert_eq!(sql, "SELECT * FROM c");
        assert!(parameters.is_empty());
        let filter = FlightFilter {
            date: Some("2013-01-02".to_owned()),
            origin: Some("ewr".to_owned()),
            destination: None,
            carrier: Some(" ".to_owned()),
        };
        let (sql, parameters) = filter.query();
        assert_eq!(
            sql,
            "SELECT * FROM c WHERE c.serviceDate = @date AND c.origin = @origin"
        );
        assert_eq!(
            parameters,
            vec![("@date", "2013-01-02".to_owned()), ("@origin", "EWR".to_owned())]
        );
    }
}
