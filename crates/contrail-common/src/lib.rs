//! The shared runtime of every contrail stage.
//!
//! A stage's `main.rs` loads its config with [`config::load`], calls [`telemetry::init`], creates a
//! [`shutdown::Shutdown`], and hands everything to its library's `run`. That `run` serves its routes
//! through [`server::serve_http`] (which adds `/healthz`, `/readyz` and `/metrics`) and
//! [`server::serve_grpc`] (which adds `grpc.health.v1` and server reflection), builds Kafka clients
//! from [`kafka::KafkaConfig`] (plain brokers or the Azure Event Hubs profile), and checks bearer
//! tokens with [`auth::BearerTokens`].

pub mod admin;
pub mod auth;
pub mod build_info;
pub mod config;
pub mod consume;
pub mod dead_letter;
pub mod error;
pub mod kafka;
pub mod metrics;
pub mod server;
pub mod shutdown;
pub mod stage;
pub mod telemetry;
pub mod topology;
pub mod trace;

pub use error::CommonError;
