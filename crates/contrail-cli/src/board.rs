//! The live flight board: a web endpoint independent of the stages that reads the serving store
//! (Cosmos DB) like an airport departures/arrivals display, and a flight's state history from the
//! Delta `flight_states` table.
//!
//! - `GET /` the board (one HTML page, refreshing itself every 2 s)
//! - `GET /api/flights?airport=EWR&mode=departures&carrier=UA&date=2013-01-01&limit=200`
//! - `GET /api/flights/{key}` the serving document; `GET /api/flights/{key}/history` its states
//! - `GET /api/meta` dates of the replay, and the pipeline's live status under `contrail up`

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Json, Response};
use axum::routing::get;
use clap::Args;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::RwLock;

use crate::store::{FlightFilter, Stores};

const PAGE: &str = include_str!("board.html");

/// Options of `contrail board`.
#[derive(Args, Debug, Clone)]
pub struct BoardArgs {
    /// Address to serve the board on.
    #[arg(long, default_value = "127.0.0.1:8000", env = "CONTRAIL_BOARD_LISTEN")]
    pub listen: SocketAddr,
    /// Cosmos DB endpoint.
    #[arg(
        long,
        default_value = "http://127.0.0.1:8900/",
        env = "CONTRAIL_COSMOS__ENDPOINT"
    )]
    pub cosmos_endpoint: String,
    /// Cosmos DB account key (the local endpoint's development key by default).
    #[arg(long, env = "CONTRAIL_COSMOS__KEY", hide_env_values = true)]
    pub cosmos_key: Option<String>,
    /// Delta root (local path or URL) for the state history.
    #[arg(long, default_value = "data/delta", env = "CONTRAIL_DELTA_ROOT")]
    pub delta_root: String,
    /// The date the board opens on (YYYY-MM-DD).
    #[arg(long, default_value = "2013-01-01")]
    pub date: String,
}

/// What the board shows besides the stores: the default date and, under `contrail up`, what the
/// platform is doing and the pipeline's live status.
#[derive(Debug, Clone, Default)]
pub struct BoardMeta {
    /// Dates the board offers.
    pub dates: Vec<String>,
    /// What the platform is doing: `starting: …`, `replaying`, `settling`, `done`.
    pub phase: String,
    /// Live status (JSON) shown in the header.
    pub status: Value,
}

/// Shared state of the board. It serves from the moment it is bound; until its stores are
/// [`Board::attach`]ed (under `contrail up`, once the platform runs) the data routes answer `503`
/// with the platform's phase.
#[derive(Clone)]
pub struct Board {
    stores: Arc<tokio::sync::OnceCell<Stores>>,
    meta: Arc<RwLock<BoardMeta>>,
}

impl Board {
    /// A board over `stores`.
    pub fn new(stores: Stores, meta: Arc<RwLock<BoardMeta>>) -> Board {
        let board = Board::starting(meta);
        board.attach(stores);
        board
    }

    /// A board whose stores are not open yet.
    pub fn starting(meta: Arc<RwLock<BoardMeta>>) -> Board {
        Board {
            stores: Arc::new(tokio::sync::OnceCell::new()),
            meta,
        }
    }

    /// Gives the board its stores (once; later calls are ignored).
    pub fn attach(&self, stores: Stores) {
        let _ = self.stores.set(stores);
    }

    /// The stores, or the `503` answer naming the platform's phase.
    async fn stores(&self) -> Result<&Stores, ApiError> {
        match self.stores.get() {
            Some(stores) => Ok(stores),
            None => Err(ApiError::Starting(self.meta.read().await.phase.clone())),
        }
    }

    /// The routes.
    pub fn router(self) -> Router {
        Router::new()
            .route("/", get(page))
            .route("/api/meta", get(meta))
            .route("/api/flights", get(flights))
            .route("/api/flights/{key}", get(flight))
            .route("/api/flights/{key}/history", get(history))
            .with_state(self)
    }
}

/// Serves the board on `listener` until `shutdown` resolves.
pub async fn serve(
    board: Board,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    axum::serve(listener, board.router())
        .with_graceful_shutdown(shutdown)
        .await
        .context("serving the flight board")
}

/// `contrail board`.
pub async fn run(args: BoardArgs) -> Result<()> {
    let cosmos = crate::platform::cosmos_config(&args.cosmos_endpoint, args.cosmos_key.as_deref(), false);
    let stores = Stores::open(&cosmos, &args.delta_root).await?;
    let meta = BoardMeta {
        dates: vec![args.date.clone()],
        phase: "serving".to_owned(),
        status: Value::Null,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding the board to {}", args.listen))?;
    println!("flight board: http://{}/", listener.local_addr()?);
    let board = Board::new(stores, Arc::new(RwLock::new(meta)));
    serve(board, listener, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}

enum ApiError {
    /// A store failed (502).
    Store(anyhow::Error),
    /// The platform is still starting (503, with its phase).
    Starting(String),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Store(error) => (
                StatusCode::BAD_GATEWAY,
                Json(json!({ "error": format!("{error:#}") })),
            )
                .into_response(),
            ApiError::Starting(phase) => (
                StatusCode::SERVICE_UNAVAILABLE,
                [(axum::http::header::RETRY_AFTER, "2")],
                Json(json!({ "error": format!("the platform is starting ({phase})"), "phase": phase })),
            )
                .into_response(),
        }
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(error: anyhow::Error) -> Self {
        ApiError::Store(error)
    }
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

async fn meta(State(board): State<Board>) -> Json<Value> {
    let meta = board.meta.read().await;
    Json(json!({ "dates": meta.dates, "phase": meta.phase, "status": meta.status }))
}

/// Query parameters of `/api/flights`.
#[derive(Debug, Deserialize)]
struct FlightsQuery {
    airport: Option<String>,
    mode: Option<String>,
    carrier: Option<String>,
    date: Option<String>,
    limit: Option<usize>,
}

async fn flights(
    State(board): State<Board>,
    Query(query): Query<FlightsQuery>,
) -> Result<Json<Value>, ApiError> {
    let arrivals = query.mode.as_deref() == Some("arrivals");
    let filter = FlightFilter {
        date: query.date,
        origin: if arrivals { None } else { query.airport.clone() },
        destination: if arrivals { query.airport } else { None },
        carrier: query.carrier,
    };
    let limit = query.limit.unwrap_or(300).min(5000);
    let flights = board.stores().await?.flights(&filter, limit).await?;
    Ok(Json(json!({ "flights": flights })))
}

async fn flight(State(board): State<Board>, Path(key): Path<String>) -> Result<Response, ApiError> {
    Ok(match board.stores().await?.flight(&key).await? {
        Some(document) => Json(document).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": format!("no flight {key}") })),
        )
            .into_response(),
    })
}

async fn history(State(board): State<Board>, Path(key): Path<String>) -> Result<Json<Value>, ApiError> {
    let states = board.stores().await?.history(&key).await?;
    Ok(Json(json!({ "flightKey": key, "states": states })))
}
