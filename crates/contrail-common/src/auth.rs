//! Bearer-token authentication for the ingest and admin endpoints.
//!
//! Tokens are compared in constant time over their SHA-256 digests, so neither the content nor the
//! length of a configured token leaks through response timing. Authentication fails closed: a
//! stage that listens beyond loopback refuses to start without tokens unless the section says
//! `disabled = true` ([`decide`]); on loopback only, no tokens means open (the local default).

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::CommonError;
use crate::config::Secret;

/// Bearer tokens accepted on a stage's APIs (ingest API, admin API).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Tokens (prefer `tokens_file` in production).
    pub tokens: Vec<Secret>,
    /// A file with one token per line (a mounted Kubernetes secret).
    pub tokens_file: Option<PathBuf>,
    /// Run without authentication even when listening beyond loopback. Without tokens and
    /// without this, such a stage refuses to start.
    pub disabled: bool,
}

/// What a stage does about authentication at start-up ([`decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthDecision {
    /// Tokens are configured: every request must present one.
    Enforce,
    /// No tokens, listening on loopback only: open, with a warning (the local default).
    OpenOnLoopback,
    /// No tokens and `disabled = true`: open by the operator's choice, with a warning.
    OpenByChoice,
    /// Refuse to start: no tokens while listening beyond loopback.
    RefuseNoTokens,
    /// Refuse to start: tokens configured and `disabled = true` contradict each other.
    RefuseContradiction,
}

/// The start-up decision from whether tokens are `configured`, the section's `disabled` flag and
/// whether every listen address is loopback. Pure, so every combination is tested.
pub fn decide(configured: bool, disabled: bool, loopback_only: bool) -> AuthDecision {
    match (configured, disabled, loopback_only) {
        (true, true, _) => AuthDecision::RefuseContradiction,
        (true, false, _) => AuthDecision::Enforce,
        (false, true, _) => AuthDecision::OpenByChoice,
        (false, false, true) => AuthDecision::OpenOnLoopback,
        (false, false, false) => AuthDecision::RefuseNoTokens,
    }
}

impl AuthConfig {
    /// The configured tokens, including those of `tokens_file`.
    pub fn load(&self) -> Result<BearerTokens, CommonError> {
        Ok(BearerTokens::new(&self.secrets()?))
    }

    /// The configured token values (for a stage that calls another stage's authenticated API).
    pub fn secrets(&self) -> Result<Vec<Secret>, CommonError> {
        let mut tokens: Vec<Secret> = self.tokens.clone();
        if let Some(path) = &self.tokens_file {
            let text = std::fs::read_to_string(path).map_err(|error| {
                CommonError::Config(format!("auth.tokens_file {}: {error}", path.display()))
            })?;
            tokens.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|line| !line.is_empty())
                    .map(Secret::new),
            );
        }
        Ok(tokens.into_iter().filter(|token| !token.is_empty()).collect())
    }
}

/// The accepted bearer tokens.
#[derive(Clone, Default)]
pub struct BearerTokens {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for BearerTokens {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "BearerTokens({} configured)", self.digests.len())
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization: Bearer …` header.
    #[error("missing bearer token: send `Authorization: Bearer <token>`")]
    Missing,
    /// A token that is not configured.
    #[error("invalid bearer token")]
    Invalid,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl BearerTokens {
    /// Accepts the given tokens; empty secrets are ignored.
    pub fn new<'a>(tokens: impl IntoIterator<Item = &'a Secret>) -> BearerTokens {
        BearerTokens {
            digests: tokens
                .into_iter()
                .filter(|token| !token.is_empty())
                .map(|token| digest(token.expose()))
                .collect(),
        }
    }

    /// Whether a token is accepted by both `self` and `other` (e.g. a producer's token that would
    /// also open the admin API).
    pub fn shares_a_token_with(&self, other: &BearerTokens) -> bool {
        self.digests.iter().any(|digest| other.digests.contains(digest))
    }

    /// Whether any token is configured (authentication on).
    pub fn enabled(&self) -> bool {
        !self.digests.is_empty()
    }

    /// Checks an `Authorization` header value. Always succeeds when authentication is off.
    pub fn check(&self, authorization: Option<&str>) -> Result<(), AuthError> {
        if !self.enabled() {
            return Ok(());
        }
        let Some(token) = authorization.and_then(|value| {
            value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("bearer "))
        }) else {
            return Err(AuthError::Missing);
        };
        let presented = digest(token.trim());
        // Compare against every token, without stopping early.
        let matched = self
            .digests
            .iter()
            .fold(subtle::Choice::from(0u8), |found, known| {
                found | known.ct_eq(&presented)
            });
        if bool::from(matched) {
            Ok(())
        } else {
            Err(AuthError::Invalid)
        }
    }

    /// A tonic interceptor enforcing these tokens on the `authorization` metadata.
    pub fn grpc_interceptor(
        &self,
    ) -> impl Fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone + use<> {
        let tokens = self.clone();
        move |request: tonic::Request<()>| {
            let header = request
                .metadata()
                .get("authorization")
                .and_then(|value| value.to_str().ok());
            match tokens.check(header) {
                Ok(()) => Ok(request),
                Err(error) => Err(tonic::Status::unauthenticated(error.to_string())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fails_closed_beyond_loopback() {
        use AuthDecision::*;
        for configured in [false, true] {
            for disabled in [false, true] {
                for loopback_only in [false, true] {
                    let decision = decide(configured, disabled, loopback_only);
                    let expected = match (configured, disabled) {
                        (true, true) => RefuseContradiction,
                        (true, false) => Enforce,
                        (false, true) => OpenByChoice,
                        (false, false) if loopback_only => OpenOnLoopback,
                        (false, false) => RefuseNoTokens,
                    };
                    assert_eq!(decision, expected, "{configured} {disabled} {loopback_only}");
                }
            }
        }
    }

    #[test]
    fn off_when_no_token_configured() {
        let tokens = BearerTokens::new(&[Secret::new("")]);
        assert!(!tokens.enabled());
        assert_eq!(tokens.check(None), Ok(()));
    }

    #[test]
    fn shared_tokens_are_found() {
        let producers = BearerTokens::new(&[Secret::new("p1"), Secret::new("both")]);
        let operators = BearerTokens::new(&[Secret::new("o1"), Secret::new("both")]);
        assert!(producers.shares_a_token_with(&operators));
        let operators = BearerTokens::new(&[Secret::new("o1")]);
        assert!(!producers.shares_a_token_with(&operators));
        assert!(!producers.shares_a_token_with(&BearerTokens::default()));
    }

    #[test]
    fn accepts_only_configured_tokens() {
        let configured = [Secret::new("alpha"), Secret::new("beta")];
        let tokens = BearerTokens::new(&configured);
        assert_eq!(tokens.check(Some("Bearer alpha")), Ok(()));
        assert_eq!(tokens.check(Some("Bearer beta")), Ok(()));
        assert_eq!(tokens.check(Some("Bearer gamma")), Err(AuthError::Invalid));
        assert_eq!(tokens.check(Some("Bearer alph")), Err(AuthError::Invalid));
        assert_eq!(tokens.check(Some("Basic alpha")), Err(AuthError::Missing));
        assert_eq!(tokens.check(None), Err(AuthError::Missing));
    }

    #[test]
    fn interceptor_maps_to_unauthenticated() {
        let tokens = BearerTokens::new(&[Secret::new("alpha")]);
        let interceptor = tokens.grpc_interceptor();
        let status = interceptor(tonic::Request::new(())).expect_err("no token");
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        let mut request = tonic::Request::new(());
        request
            .metadata_mut()
            .insert("authorization", "Bearer alpha".parse().expect("ascii"));
        assert!(interceptor(request).is_ok());
    }
}
