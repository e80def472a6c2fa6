//! Bearer-token authentication for the ingest and admin endpoints.
//!
//! Tokens are compared in constant time over their SHA-256 digests, so neither the content nor the
//! length of a configured token leaks through response timing. With no token configured,
//! authentication is off (the local default); production config sets at least one.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::CommonError;
use crate::config::Secret;

/// Bearer tokens accepted on a stage's APIs (ingest API, admin API). Empty: authentication off.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Tokens (prefer `tokens_file` in production).
    pub tokens: Vec<Secret>,
    /// A file with one token per line (a mounted Kubernetes secret).
    pub tokens_file: Option<PathBuf>,
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
    fn off_when_no_token_configured() {
        let tokens = BearerTokens::new(&[Secret::new("")]);
        assert!(!tokens.enabled());
        assert_eq!(tokens.check(None), Ok(()));
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
