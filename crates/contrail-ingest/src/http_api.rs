//! `POST /v1/events`: one JSON object, a JSON array, or NDJSON; optionally gzip-compressed.
//!
//! Answers (always JSON):
//! - `202` every record is on `ops.events.raw`;
//! - `400` some records were rejected (each named with its fields; the valid ones *were* accepted
//!   and every rejected one is on `ops.events.dlq`), or the body is empty / not valid gzip;
//! - `401` missing or wrong bearer token;
//! - `413` body or record count above the configured limits;
//! - `429` over capacity, with `Retry-After`;
//! - `503` the broker did not acknowledge in time (or ingest is paused), with `Retry-After`: retry
//!   the request — event ids make the retry harmless.
//!
//! `?results=failures` lists only records that were not accepted (smaller answers for big batches).

use std::io::Read;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use contrail_common::auth::BearerTokens;
use contrail_common::trace::{TRACEPARENT, TraceParent};
use contrail_events::{BodyError, split_body};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::IngestError;
use crate::pipeline::{BatchOutcome, Origin, Pipeline, RecordStatus};

/// What the HTTP API needs.
#[derive(Clone)]
pub struct HttpApiState {
    /// The publish path.
    pub pipeline: Pipeline,
    /// Accepted bearer tokens.
    pub tokens: BearerTokens,
    /// Largest body after decompression.
    pub max_body_bytes: usize,
    /// Most records per request.
    pub max_records_per_request: usize,
}

/// The ingest routes, behind bearer-token authentication.
pub fn routes(state: HttpApiState) -> Router {
    let tokens = state.tokens.clone();
    Router::new()
        .route("/v1/events", post(post_events))
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            let tokens = tokens.clone();
            async move { authenticate(tokens, request, next).await }
        }))
        .with_state(state)
}

async fn authenticate(tokens: BearerTokens, request: Request, next: Next) -> Response {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    match tokens.check(header) {
        Ok(()) => next.run(request).await,
        Err(error) => {
            let mut response = error_response(StatusCode::UNAUTHORIZED, &error.to_string());
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
}

#[derive(Debug, Deserialize, Default)]
struct PublishParams {
    results: Option<String>,
}

async fn post_events(
    State(state): State<HttpApiState>,
    Query(params): Query<PublishParams>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let compressed = axum::body::to_bytes(body, state.max_body_bytes).await;
    let Ok(raw_body) = compressed else {
        return error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!(
                "request body exceeds limits.max_body_bytes = {} bytes",
                state.max_body_bytes
            ),
        );
    };
    let gzipped = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|encoding| encoding.trim().eq_ignore_ascii_case("gzip"));
    let max_body_bytes = state.max_body_bytes;
    let max_records = state.max_records_per_request;
    let split = tokio::task::spawn_blocking(move || -> Result<_, (StatusCode, String)> {
        let body = if gzipped {
            bytes::Bytes::from(gunzip(&raw_body, max_body_bytes)?)
        } else {
            raw_body
        };
        let records =
            split_body(&body).map_err(|error: BodyError| (StatusCode::BAD_REQUEST, error.to_string()))?;
        if records.len() > max_records {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "request holds {} records; limits.max_records_per_request = {max_records}",
                    records.len()
                ),
            ));
        }
        Ok(records)
    })
    .await;
    let records = match split {
        Ok(Ok(records)) => records,
        Ok(Err((status, message))) => return error_response(status, &message),
        Err(error) => {
            return error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("request task failed: {error}"),
            );
        }
    };
    let parent = headers
        .get(TRACEPARENT)
        .and_then(|value| TraceParent::parse(value.as_bytes()));
    match state
        .pipeline
        .publish_traced(records, &Origin::Http, parent)
        .await
    {
        Ok(outcome) => outcome_response(&outcome, params.results.as_deref() == Some("failures")),
        Err(error) => ingest_error_response(&error),
    }
}

/// Decompresses a gzip body whole: every member, as `cat a.gz b.gz` and many HTTP clients
/// produce (a decoder of the first member alone would silently drop the rest).
fn gunzip(compressed: &[u8], max_bytes: usize) -> Result<Vec<u8>, (StatusCode, String)> {
    let mut decoder = flate2::read::MultiGzDecoder::new(compressed).take(max_bytes as u64 + 1);
    let mut body = Vec::new();
    decoder
        .read_to_end(&mut body)
        .map_err(|error| (StatusCode::BAD_REQUEST, format!("invalid gzip body: {error}")))?;
    if body.len() > max_bytes {
        return Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("decompressed body exceeds limits.max_body_bytes = {max_bytes} bytes"),
        ));
    }
    Ok(body)
}

/// The JSON answer for a batch, and its status code.
pub fn outcome_response(outcome: &BatchOutcome, failures_only: bool) -> Response {
    let results: Vec<Value> = outcome
        .records
        .iter()
        .filter(|record| !(failures_only && record.status == RecordStatus::Accepted))
        .map(|record| {
            let mut result = json!({"index": record.index, "event_id": record.event_id});
            match &record.status {
                RecordStatus::Accepted => {
                    result["status"] = json!("accepted");
                    result["flight_key"] = json!(record.flight_key);
                }
                RecordStatus::Rejected(errors) => {
                    result["status"] = json!("rejected");
                    result["errors"] = errors
                        .iter()
                        .map(|error| json!({"field": error.field, "message": error.message}))
                        .collect();
                }
                RecordStatus::Failed(reason) => {
                    result["status"] = json!("failed");
                    result["error"] = json!(reason);
                }
            }
            result
        })
        .collect();
    let body = json!({"accepted": outcome.accepted, "rejected": outcome.rejected,
                      "failed": outcome.failed, "results": results});
    let status = if outcome.failed > 0 {
        StatusCode::SERVICE_UNAVAILABLE
    } else if outcome.rejected > 0 {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::ACCEPTED
    };
    let mut response = (status, axum::Json(body)).into_response();
    if outcome.failed > 0 {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
    }
    response
}

fn ingest_error_response(error: &IngestError) -> Response {
    let (status, retry_after) = match error {
        IngestError::OverCapacity { .. } => (StatusCode::TOO_MANY_REQUESTS, Some("1")),
        IngestError::BrokerUnavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, Some("2")),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, None),
    };
    let mut response = error_response(status, &error.to_string());
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static(seconds));
    }
    response
}

fn error_response(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).expect("compress");
        encoder.finish().expect("compress")
    }

    /// `cat a.gz b.gz`: both members are read, in order.
    #[test]
    fn a_body_of_several_gzip_members_is_read_whole() {
        let mut body = gzip(b"{\"first\":1}\n");
        body.extend(gzip(b"{\"second\":2}\n"));
        body.extend(gzip(b"{\"third\":3}\n"));
        assert_eq!(
            gunzip(&body, 1_000).expect("valid gzip"),
            b"{\"first\":1}\n{\"second\":2}\n{\"third\":3}\n"
        );
        // The limit counts every member's bytes.
        let (status, message) = gunzip(&body, 30).expect_err("over the limit");
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(message.contains("limits.max_body_bytes = 30"), "{message}");
        // A broken second member is an error, not a silent stop after the first.
        let mut broken = gzip(b"{}\n");
        broken.extend(&gzip(b"{}\n")[..12]);
        assert_eq!(
            gunzip(&broken, 1_000).expect_err("truncated").0,
            StatusCode::BAD_REQUEST
        );
    }
}
