//! `contrail flights get KEY` and `contrail flights export`: flights from the serving store.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::stores::{FlightFilter, Stores, service_date};

/// Options of `contrail flights`.
#[derive(Args, Debug)]
pub struct FlightsArgs {
    #[command(flatten)]
    cosmos: crate::args::CosmosArgs,
    /// Port offset of a `contrail up --port-offset N` platform.
    #[arg(long, default_value_t = 0, env = "CONTRAIL_PORT_OFFSET")]
    port_offset: u16,
    #[command(subcommand)]
    command: FlightsCommand,
}

#[derive(Subcommand, Debug)]
enum FlightsCommand {
    /// One flight's serving document, by flight key (e.g. UA1545-2013-01-01-EWR).
    Get {
        /// The flight key `{carrier}{number}-{YYYY-MM-DD}-{origin}`.
        key: String,
        /// Print the document as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Every flight (or those matching the filters) as JSON lines, sorted by scheduled departure.
    Export {
        /// Only this service date (YYYY-MM-DD).
        #[arg(long)]
        date: Option<String>,
        /// Only departures from this airport.
        #[arg(long)]
        origin: Option<String>,
        /// Only arrivals at this airport.
        #[arg(long)]
        destination: Option<String>,
        /// Only this carrier.
        #[arg(long)]
        carrier: Option<String>,
        /// Write to this file instead of stdout.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

/// Runs `contrail flights`.
pub async fn run(args: FlightsArgs) -> Result<()> {
    let cosmos = args.cosmos.config(args.port_offset, false);
    // The history is not read here; the Delta root is unused.
    let stores = Stores::open(&cosmos, "").await?;
    match args.command {
        FlightsCommand::Get { key, json } => {
            service_date(&key)?;
            let document = stores
                .flight(&key)
                .await?
                .with_context(|| format!("no flight {key} in the serving store"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&document)?);
            } else {
                print!("{}", describe(&document));
            }
        }
        FlightsCommand::Export {
            date,
            origin,
            destination,
            carrier,
            output,
        } => {
            let filter = FlightFilter {
                date,
                origin,
                destination,
                carrier,
            };
            let flights = stores.flights(&filter, usize::MAX).await?;
            let mut writer: Box<dyn std::io::Write> = match &output {
                Some(path) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
                )),
                None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
            };
            for flight in &flights {
                serde_json::to_writer(&mut writer, flight)?;
                writer.write_all(b"\n")?;
            }
            writer.flush()?;
            if let Some(path) = output {
                eprintln!("exported {} flights to {}", flights.len(), path.display());
            }
        }
    }
    Ok(())
}

/// A document as aligned `field  value` lines, in the contract's field order.
pub fn describe(document: &Value) -> String {
    let mut text = String::new();
    // `id` equals `flightKey`; shown once.
    for field in contrail_flight::document::FIELDS.into_iter().skip(1) {
        let value = match &document[field] {
            Value::Null => "—".to_owned(),
            Value::String(text) if text.is_empty() => "—".to_owned(),
            Value::String(text) => text.clone(),
            Value::Array(items) if items.is_empty() => "—".to_owned(),
            other => other.to_string(),
        };
        text.push_str(&format!("{field:<14} {value}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_is_described_field_by_field() {
        let document = serde_json::json!({
            "flightKey": "UA1545-2013-01-01-EWR", "status": "ARRIVED", "gate": "", "version": 7,
            "delayCodes": ["RA"], "actualIn": null,
        });
        let text = describe(&document);
        assert!(
            text.starts_with("flightKey      UA1545-2013-01-01-EWR\n"),
            "{text}"
        );
        assert!(text.contains("status         ARRIVED\n"));
        assert!(text.contains("gate           —\n"));
        assert!(text.contains("actualIn       —\n"));
        assert!(text.contains("delayCodes     [\"RA\"]\n"));
        assert!(text.contains("version        7\n"));
        assert_eq!(text.lines().count(), 25);
    }
}
