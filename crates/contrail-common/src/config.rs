//! Layered configuration: defaults < TOML file (`--config`) < environment (`CONTRAIL_…`).
//!
//! Environment variables map onto keys by lower-casing and splitting on `__`:
//! `CONTRAIL_KAFKA__BROKERS=host:9092` sets `kafka.brokers`. Unknown keys in the file *or* the
//! environment are errors that name the key, because a typo in production config must not be
//! silently ignored. Secrets are [`Secret`]s: they never appear in `Debug` output or in the
//! effective config printed at start.

use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::CommonError;

/// Prefix of every contrail environment variable.
pub const ENV_PREFIX: &str = "CONTRAIL_";

/// `CONTRAIL_*` variables that are read by tools, not stage config keys: the config file's name,
/// `contrail replay`'s target and token, the flight data folder, the local brokers' binaries, the
/// commit a build records for `--version` (`scripts/setup.sh` exports it), the board's token and
/// the local Cosmos endpoint's key and address. Every other `CONTRAIL_*` variable must be a key
/// of the stage's config.
pub const TOOL_VARIABLES: [&str; 16] = [
    "config_file",
    "ingest_url",
    "ingest_token",
    "flight_data",
    "tansu_bin",
    "nisshi_bin",
    "tools_dir",
    "azurite_blob",
    "port_offset",
    "admin_addr",
    "admin_token",
    "board_listen",
    "board_token",
    "cosmos_dev_key",
    "cosmos_dev_listen",
    "git_commit",
];

/// Loads a stage's config: its `Default`, then the TOML file if given, then `CONTRAIL_…` variables.
pub fn load<T>(file: Option<&Path>) -> Result<T, CommonError>
where
    T: DeserializeOwned + Serialize + Default,
{
    let environment = Env::prefixed(ENV_PREFIX)
        .filter(|key| !TOOL_VARIABLES.iter().any(|tool| key == *tool))
        .split("__");
    load_from(file, environment)
}

/// As [`load`] with an explicit environment provider (tests use a jail instead of the process env).
pub fn load_from<T>(file: Option<&Path>, environment: Env) -> Result<T, CommonError>
where
    T: DeserializeOwned + Serialize + Default,
{
    let mut figment = Figment::from(Serialized::defaults(T::default()));
    if let Some(path) = file {
        if !path.is_file() {
            return Err(CommonError::Config(format!(
                "config file {} does not exist or is not a file",
                path.display()
            )));
        }
        figment = figment.merge(Toml::file(path));
    }
    figment
        .merge(environment)
        .extract()
        .map_err(|error| CommonError::Config(describe(error)))
}

fn describe(error: figment::Error) -> String {
    error
        .into_iter()
        .map(|single| {
            let source = single
                .metadata
                .as_ref()
                .map(
                    |metadata| match &single.metadata.as_ref().and_then(|m| m.source.as_ref()) {
                        Some(source) => format!(" (from {} {source})", metadata.name),
                        None => format!(" (from {})", metadata.name),
                    },
                )
                .unwrap_or_default();
            let path = if single.path.is_empty() {
                String::new()
            } else {
                format!("key `{}`: ", single.path.join("."))
            };
            format!("{path}{}{source}", single.kind)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The effective config as TOML, for printing at start. Secrets show as `"<redacted>"`.
pub fn render_effective<T: Serialize>(config: &T) -> String {
    toml::to_string(config).unwrap_or_else(|error| format!("<cannot render config: {error}>"))
}

/// A secret string (token, key, connection string, storage option). Deserializes from a string —
/// or from a bare boolean, which is what an environment variable like `…=true` parses as;
/// serializes and prints as `<redacted>` so it never reaches a log or the effective-config dump.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Secret, D::Error> {
        struct Scalar;
        impl serde::de::Visitor<'_> for Scalar {
            type Value = Secret;
            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                // A number is refused rather than re-printed: `007` would silently become `7`.
                formatter.write_str("a string (a number must be quoted: CONTRAIL_…='\"007\"')")
            }
            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<Secret, E> {
                Ok(Secret(value.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, value: String) -> Result<Secret, E> {
                Ok(Secret(value))
            }
            fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<Secret, E> {
                Ok(Secret(value.to_string()))
            }
        }
        deserializer.deserialize_any(Scalar)
    }
}

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret value. Call only where it is used (an HTTP header, a client setting).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it is empty (not configured).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("<redacted>")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0.is_empty() {
            serializer.serialize_str("")
        } else {
            serializer.serialize_str("<redacted>")
        }
    }
}

/// HTTP and gRPC listen addresses of a stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenConfig {
    /// HTTP: `/healthz`, `/readyz`, `/metrics` and the stage's HTTP API.
    pub http: String,
    /// gRPC: admin API, `grpc.health.v1`, reflection and the stage's gRPC API.
    pub grpc: String,
}

impl ListenConfig {
    /// Listen addresses with the given ports on all interfaces.
    pub fn on_ports(http_port: u16, grpc_port: u16) -> ListenConfig {
        ListenConfig {
            http: format!("0.0.0.0:{http_port}"),
            grpc: format!("0.0.0.0:{grpc_port}"),
        }
    }

    /// The default listen addresses of `stage` (its ports from [`crate::topology`]).
    pub fn of(stage: crate::topology::StageSpec) -> ListenConfig {
        ListenConfig::on_ports(stage.http, stage.grpc)
    }

    /// The first listen address reachable beyond this host (not loopback), if any. An address
    /// that does not parse counts as beyond loopback.
    pub fn beyond_loopback(&self) -> Option<&str> {
        [self.http.as_str(), self.grpc.as_str()]
            .into_iter()
            .find(|address| !is_loopback(address))
    }
}

/// Whether `address` (`host:port`) only listens on this host.
fn is_loopback(address: &str) -> bool {
    if let Ok(socket) = address.parse::<std::net::SocketAddr>() {
        return socket.ip().is_loopback();
    }
    address
        .rsplit_once(':')
        .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost"))
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig::of(crate::topology::INGEST)
    }
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error by design.
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses() {
        let listen = |http: &str, grpc: &str| ListenConfig {
            http: http.to_owned(),
            grpc: grpc.to_owned(),
        };
        assert_eq!(listen("127.0.0.1:1", "[::1]:2").beyond_loopback(), None);
        assert_eq!(listen("localhost:1", "127.0.0.2:2").beyond_loopback(), None);
        assert_eq!(
            listen("127.0.0.1:1", "0.0.0.0:2").beyond_loopback(),
            Some("0.0.0.0:2")
        );
        assert_eq!(listen("[::]:1", "127.0.0.1:2").beyond_loopback(), Some("[::]:1"));
        assert_eq!(
            listen("10.0.0.4:1", "127.0.0.1:2").beyond_loopback(),
            Some("10.0.0.4:1")
        );
        assert_eq!(
            listen("ingest:1", "127.0.0.1:2").beyond_loopback(),
            Some("ingest:1")
        );
        assert_eq!(ListenConfig::default().beyond_loopback(), Some("0.0.0.0:8080"));
    }

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Sample {
        name: String,
        token: Secret,
        listen: ListenConfig,
    }

    #[test]
    fn layers_apply_in_order_and_env_wins() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "stage.toml",
                "name = \"from-file\"\n[listen]\nhttp = \"127.0.0.1:1\"\n",
            )?;
            jail.set_env("TESTCFG_NAME", "from-env");
            jail.set_env("TESTCFG_LISTEN__GRPC", "127.0.0.1:2");
            let config: Sample = load_from(
                Some(Path::new("stage.toml")),
                Env::prefixed("TESTCFG_").split("__"),
            )
            .map_err(|error| error.to_string())?;
            assert_eq!(config.name, "from-env");
            assert_eq!(config.listen.http, "127.0.0.1:1");
            assert_eq!(config.listen.grpc, "127.0.0.1:2");
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_are_rejected_by_name() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("stage.toml", "[listen]\nhtp = \"x\"\n")?;
            let error = load_from::<Sample>(Some(Path::new("stage.toml")), Env::prefixed("TESTCFG_"))
                .expect_err("unknown key");
            let message = error.to_string();
            assert!(message.contains("htp") && message.contains("listen"), "{message}");
            jail.set_env("TESTCFG_COLOUR", "blue");
            let error = load_from::<Sample>(None, Env::prefixed("TESTCFG_")).expect_err("unknown env");
            assert!(error.to_string().contains("colour"), "{error}");
            Ok(())
        });
    }

    #[test]
    fn tool_variables_are_not_config_keys() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("CONTRAIL_INGEST_TOKEN", "t");
            jail.set_env("CONTRAIL_TANSU_BIN", "/bin/true");
            jail.set_env("CONTRAIL_NISSHI_BIN", "/bin/true");
            // scripts/setup.sh exports these for the tests' tools.
            jail.set_env("CONTRAIL_TOOLS_DIR", "/var/tmp/contrail-tools");
            jail.set_env("CONTRAIL_AZURITE_BLOB", "/bin/true");
            jail.set_env("CONTRAIL_GIT_COMMIT", "806bbe2");
            // `contrail up`'s board and the local Cosmos endpoint, set in the same shell.
            jail.set_env("CONTRAIL_BOARD_TOKEN", "b");
            jail.set_env("CONTRAIL_COSMOS_DEV_KEY", "a2V5");
            jail.set_env("CONTRAIL_COSMOS_DEV_LISTEN", "127.0.0.1:8900");
            jail.set_env("CONTRAIL_NAME", "from-env");
            let config: Sample = load(None).map_err(|error| error.to_string())?;
            assert_eq!(config.name, "from-env");
            Ok(())
        });
    }

    #[test]
    fn missing_config_file_is_named() {
        let error = load::<Sample>(Some(Path::new("/nonexistent/contrail.toml"))).expect_err("missing");
        assert!(error.to_string().contains("/nonexistent/contrail.toml"));
    }

    #[test]
    fn a_secret_set_to_a_bare_boolean_is_its_text_and_a_bare_number_is_refused() {
        figment::Jail::expect_with(|jail| {
            let environment = || Env::prefixed("TESTCFG_").split("__");
            jail.set_env("TESTCFG_TOKEN", "true");
            let sample: Sample = load_from(None, environment()).map_err(|error| error.to_string())?;
            assert_eq!(sample.token.expose(), "true");
            jail.set_env("TESTCFG_TOKEN", "007");
            let error = load_from::<Sample>(None, environment()).expect_err("a number");
            assert!(error.to_string().contains("token"), "{error}");
            assert!(error.to_string().contains("quoted"), "{error}");
            jail.set_env("TESTCFG_TOKEN", "\"007\"");
            let sample: Sample = load_from(None, environment()).map_err(|error| error.to_string())?;
            assert_eq!(sample.token.expose(), "007");
            Ok(())
        });
    }

    #[test]
    fn secrets_are_redacted_everywhere() {
        let sample = Sample {
            token: Secret::new("hunter2"),
            ..Sample::default()
        };
        assert!(!format!("{sample:?}").contains("hunter2"));
        assert!(!render_effective(&sample).contains("hunter2"));
        assert_eq!(sample.token.expose(), "hunter2");
    }
}
