//! A connection to one stage's admin API: the bearer token (never printed), the channel, and
//! errors that name the stage, the RPC and what to do.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use contrail_proto::admin::v1 as admin;
use contrail_proto::admin::v1::admin_service_client::AdminServiceClient;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};

use super::target::Target;

/// The admin bearer token. Its `Debug` is redacted, so the token reaches no log and no error.
#[derive(Clone)]
pub(super) struct AdminToken(String);

impl From<String> for AdminToken {
    fn from(token: String) -> AdminToken {
        AdminToken(token)
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("AdminToken(<redacted>)")
    }
}

impl AdminToken {
    /// The `authorization` metadata value; `None` for an empty token (no header is sent).
    pub(super) fn authorization(&self) -> Result<Option<AsciiMetadataValue>> {
        let token = self.0.trim();
        if token.is_empty() {
            return Ok(None);
        }
        // The error names neither the token nor the header value: both hold the secret.
        let value = AsciiMetadataValue::try_from(format!("Bearer {token}")).map_err(|_| {
            anyhow!("the admin token holds characters an HTTP header cannot carry (check --token)")
        })?;
        Ok(Some(value))
    }
}

/// The RPCs only stateful stages serve; the others answer UNIMPLEMENTED.
pub(super) const STATEFUL_RPCS: [&str; 4] = [
    "TriggerCheckpoint",
    "ListCheckpoints",
    "RestoreCheckpoint",
    "ReadKeyState",
];

/// What to tell the operator when `target` answered `rpc` with an error status.
pub(super) fn rpc_failure(target: &Target, rpc: &str, status: &tonic::Status) -> anyhow::Error {
    let name = target.name();
    let server_message = status.message();
    match status.code() {
        tonic::Code::Unimplemented if STATEFUL_RPCS.contains(&rpc) => anyhow!(
            "{name} does not support {rpc} (only dedup-state keeps checkpoints/state): {server_message}"
        ),
        tonic::Code::Unimplemented => anyhow!("{name} does not support {rpc}: {server_message}"),
        tonic::Code::Unauthenticated => anyhow!(
            "the admin API refused the token: pass --token or set CONTRAIL_ADMIN_TOKEN \
             ({name} answered {rpc} with: {server_message})"
        ),
        tonic::Code::Unavailable => anyhow!("cannot reach {}: {server_message}", target.describe_api()),
        code => anyhow!("{name} failed {rpc}: {server_message} (gRPC {code:?})"),
    }
}

/// `error` and its causes, joined: tonic's transport error alone says only "transport error".
pub(super) fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut messages = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if messages.last() != Some(&message) {
            messages.push(message);
        }
        source = cause.source();
    }
    messages.join(": ")
}

/// A connection to one stage's admin API, with what every call needs.
pub(super) struct AdminSession {
    pub(super) target: Target,
    pub(super) client: AdminServiceClient<Channel>,
    authorization: Option<AsciiMetadataValue>,
    timeout: Duration,
}

impl AdminSession {
    /// Connects to `target`, giving up after `timeout`.
    pub(super) async fn connect(
        target: Target,
        authorization: Option<AsciiMetadataValue>,
        timeout: Duration,
    ) -> Result<AdminSession> {
        let endpoint = Endpoint::from_shared(target.url.clone())
            .map_err(|error| {
                anyhow!(
                    "invalid admin address {:?} (expected e.g. http://127.0.0.1:9091): {}",
                    target.url,
                    error_chain(&error)
                )
            })?
            .connect_timeout(timeout);
        // The outer timeout also bounds the HTTP/2 handshake, which `connect_timeout` does not.
        let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(error)) => bail!("cannot reach {}: {}", target.describe_api(), error_chain(&error)),
            Err(_elapsed) => bail!(
                "cannot reach {}: no connection within {} s",
                target.describe_api(),
                timeout.as_secs()
            ),
        };
        Ok(AdminSession {
            target,
            client: AdminServiceClient::new(channel),
            authorization,
            timeout,
        })
    }

    /// `message` with the bearer token attached.
    pub(super) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(authorization) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", authorization.clone());
        }
        request
    }

    /// Awaits `call` (the RPC named `rpc`) within the timeout and explains any failure.
    pub(super) async fn answer<T>(
        &self,
        rpc: &str,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(rpc_failure(&self.target, rpc, &status)),
            Err(_elapsed) => Err(anyhow!(
                "{} did not answer {rpc} within {} s",
                self.target.name(),
                self.timeout.as_secs()
            )),
        }
    }

    pub(super) async fn status(&self) -> Result<admin::StatusResponse> {
        let mut client = self.client.clone();
        self.answer("Status", client.status(self.request(admin::StatusRequest {})))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::super::target::Stage;
    use super::*;

    #[test]
    fn grpc_failures_say_what_to_do() {
        let target = Target {
            stage: Some(Stage::CosmosWriter),
            url: "http://127.0.0.1:9192".to_owned(),
        };
        let unimplemented = tonic::Status::unimplemented("progress lives in the Kafka offsets");
        let message = rpc_failure(&target, "TriggerCheckpoint", &unimplemented).to_string();
        assert!(
            message.starts_with("cosmos-writer does not support TriggerCheckpoint (only dedup-state"),
            "{message}"
        );

        let unauthenticated = tonic::Status::unauthenticated("invalid bearer token");
        let message = rpc_failure(&target, "Status", &unauthenticated).to_string();
        assert!(
            message.starts_with("the admin API refused the token: pass --token or set CONTRAIL_ADMIN_TOKEN"),
            "{message}"
        );

        let unavailable = tonic::Status::unavailable("connection reset");
        let message = rpc_failure(&target, "Status", &unavailable).to_string();
        assert_eq!(
            message,
            "cannot reach cosmos-writer admin API at http://127.0.0.1:9192: connection reset"
        );
    }

    #[test]
    fn token_is_redacted_and_sent_as_bearer() {
        let token = AdminToken::from("s3cret".to_owned());
        assert!(!format!("{token:?}").contains("s3cret"));
        let header = token.authorization().expect("valid").expect("a header");
        assert_eq!(header.to_str().expect("ascii"), "Bearer s3cret");
        assert_eq!(
            AdminToken::from("  ".to_owned()).authorization().expect("valid"),
            None
        );
        let error = AdminToken::from("bad\ntoken".to_owned())
            .authorization()
            .expect_err("newline");
        assert!(!error.to_string().contains("bad"), "{error}");
    }
}
