//! The live flight board: a web endpoint independent of the stages that reads the serving store
//! (Cosmos DB) like an airport departures/arrivals display, and a flight's state history from the
//! Delta `flight_states` table.
//!
//! - `GET /` the board (one HTML page, refreshing itself every 2 s)
//! - `GET /api/flights?airport=EWR&mode=departures&carrier=UA&date=2013-01-01&q=1545&offset=0&limit=100`
//!   one page of the matching flights and their total (`q`: flight number or tail, e.g. `UA1545`,
//!   `1545`, `N14228`); the Cosmos query behind it runs at most once per [`FLIGHTS_REFRESH`] per
//!   filter, whatever the number of viewers
//! - `GET /api/flights/{key}` the serving document; `GET /api/flights/{key}/history` its states
//! - `GET /api/meta` dates of the replay, airport time zones (the board shows local times), and
//!   the pipeline's live status under `contrail up`
//!
//! With tokens (`contrail board --token`, required when it listens beyond loopback) every `/api/`
//! route wants `Authorization: Bearer <token>`; the page itself holds no data and takes the token
//! from its URL (`http://host:8000/#token=…`), keeping it in the tab's session storage.
//! - `GET /api/alerts?date=2013-01-01` the open alerts (raised, not resolved) from the Delta
//!   `alerts` table, read at most once per [`ALERTS_REFRESH`] whatever the number of viewers

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Json, Response};
use axum::routing::get;
use clap::Args;
use contrail_common::auth::{AuthDecision, BearerTokens, decide};
use contrail_common::config::Secret;
use contrail_proto::v1::{Alert, AlertState};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::RwLock;

use crate::stores::{FlightFilter, Stores};

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
    /// Bearer token the board's data routes require (open it as `http://HOST:PORT/#token=…`).
    /// Required when `--listen` is beyond loopback, unless `--no-auth`. Never printed.
    #[arg(long, env = "CONTRAIL_BOARD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Serve the board beyond loopback without a token (anyone who reaches it sees every flight).
    #[arg(long, conflicts_with = "token")]
    pub no_auth: bool,
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

/// What the board shows the platform doing (before a run's context exists, too).
pub(crate) async fn set_phase(meta: &RwLock<BoardMeta>, phase: &str) {
    meta.write().await.phase = phase.to_owned();
}

/// Shared state of the board. It serves from the moment it is bound; until its stores are
/// [`Board::attach`]ed (under `contrail up`, once the platform runs) the data routes answer `503`
/// with the platform's phase.
#[derive(Clone)]
pub struct Board {
    stores: Arc<tokio::sync::OnceCell<Stores>>,
    meta: Arc<RwLock<BoardMeta>>,
    /// The alerts table as last read: one read per [`ALERTS_REFRESH`] for all viewers.
    alerts: Arc<SharedReads<(), Vec<Alert>>>,
    /// The flights of each filter as last queried: one query per [`FLIGHTS_REFRESH`].
    flights: Arc<SharedReads<FlightFilter, Vec<Value>>>,
    /// Tokens the data routes require (none: open).
    tokens: Arc<BearerTokens>,
    /// Airport → IANA time zone, for local times on the page.
    zones: Arc<BTreeMap<String, String>>,
}

/// How often the board queries Cosmos DB for one filter at most.
pub const FLIGHTS_REFRESH: Duration = Duration::from_secs(2);

/// Flights one filter may list at most (a month of one airport's departures fits).
const FLIGHTS_PER_FILTER: usize = 20_000;

/// Reads shared by every viewer: a value per key, read again only when older than the interval;
/// concurrent requests wait for the one read in progress instead of reading too.
pub struct SharedReads<K, T> {
    every: Duration,
    slots: tokio::sync::Mutex<HashMap<K, (Instant, Arc<T>)>>,
}

impl<K: std::hash::Hash + Eq + Clone, T> SharedReads<K, T> {
    /// Reads at most once per `every` per key.
    pub fn new(every: Duration) -> SharedReads<K, T> {
        SharedReads {
            every,
            slots: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The value of `key`, read by `read` if there is none younger than the interval.
    pub async fn get<F, E>(&self, key: &K, read: F) -> Result<Arc<T>, E>
    where
        F: std::future::Future<Output = Result<T, E>>,
    {
        let mut slots = self.slots.lock().await;
        if let Some((read_at, value)) = slots.get(key)
            && read_at.elapsed() < self.every
        {
            return Ok(value.clone());
        }
        let value = Arc::new(read.await?);
        // Forget what no viewer asked for in a while.
        let stale = self.every * 30;
        slots.retain(|_, (read_at, _)| read_at.elapsed() < stale);
        slots.insert(key.clone(), (Instant::now(), value.clone()));
        Ok(value)
    }
}

/// How often the board reads the alerts table at most.
pub const ALERTS_REFRESH: Duration = Duration::from_secs(2);

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
            alerts: Arc::new(SharedReads::new(ALERTS_REFRESH)),
            flights: Arc::new(SharedReads::new(FLIGHTS_REFRESH)),
            tokens: Arc::new(BearerTokens::default()),
            zones: Arc::new(
                contrail_flightdata::default_data_dir()
                    .and_then(|dir| contrail_flightdata::TimeZones::load(&dir).ok())
                    .map(|zones| zones.iana_names())
                    .unwrap_or_default(),
            ),
        }
    }

    /// The board requiring one of `tokens` on its data routes.
    pub fn with_tokens(mut self, tokens: BearerTokens) -> Board {
        self.tokens = Arc::new(tokens);
        self
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
        let api = Router::new()
            .route("/api/meta", get(meta))
            .route("/api/flights", get(flights))
            .route("/api/flights/{key}", get(flight))
            .route("/api/flights/{key}/history", get(history))
            .route("/api/alerts", get(alerts))
            .route_layer(axum::middleware::from_fn_with_state(self.clone(), require_token));
        Router::new().route("/", get(page)).merge(api).with_state(self)
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
    let cosmos = crate::local::cosmos_config(&args.cosmos_endpoint, args.cosmos_key.as_deref(), false);
    let stores = Stores::open(&cosmos, &args.delta_root).await?;
    let meta = BoardMeta {
        dates: vec![args.date.clone()],
        phase: "serving".to_owned(),
        status: Value::Null,
    };
    let secrets: Vec<Secret> = args.token.iter().map(Secret::new).collect();
    let tokens = BearerTokens::new(&secrets);
    match decide(tokens.enabled(), args.no_auth, args.listen.ip().is_loopback()) {
        AuthDecision::RefuseNoTokens => anyhow::bail!(
            "--listen {} is beyond loopback: set --token (CONTRAIL_BOARD_TOKEN) so only those who have it \
             see the flights, or --no-auth to serve them to anyone who reaches it",
            args.listen
        ),
        AuthDecision::OpenByChoice => {
            eprintln!("contrail: the board serves every flight without a token (--no-auth)")
        }
        _ => {}
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding the board to {}", args.listen))?;
    let suffix = if tokens.enabled() {
        "#token=<your token>"
    } else {
        ""
    };
    println!("flight board: http://{}/{suffix}", listener.local_addr()?);
    let board = Board::new(stores, Arc::new(RwLock::new(meta))).with_tokens(tokens);
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
    Json(json!({
        "dates": meta.dates,
        "phase": meta.phase,
        "status": meta.status,
        "zones": *board.zones,
    }))
}

/// Refuses a data route without a valid token (when the board has tokens).
async fn require_token(
    State(board): State<Board>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let header = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    match board.tokens.check(header) {
        Ok(()) => next.run(request).await,
        Err(error) => (
            StatusCode::UNAUTHORIZED,
            [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
            Json(json!({ "error": error.to_string() })),
        )
            .into_response(),
    }
}

/// Query parameters of `/api/flights`.
#[derive(Debug, Deserialize)]
struct FlightsQuery {
    airport: Option<String>,
    mode: Option<String>,
    carrier: Option<String>,
    date: Option<String>,
    /// Flight number or tail.
    q: Option<String>,
    offset: Option<usize>,
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
    let stores = board.stores().await?;
    let all = board
        .flights
        .get(&filter, stores.flights(&filter, FLIGHTS_PER_FILTER))
        .await?;
    let offset = query.offset.unwrap_or(0);
    let limit = query.limit.unwrap_or(100).clamp(1, 1000);
    let (flights, total) = flights_page(&all, query.q.as_deref(), offset, limit);
    Ok(Json(
        json!({ "flights": flights, "total": total, "offset": offset, "limit": limit }),
    ))
}

/// The flights matching `search` (flight number with or without carrier, or tail number; case,
/// spaces and dashes ignored), `limit` of them from `offset`, and how many match.
pub fn flights_page(
    flights: &[Value],
    search: Option<&str>,
    offset: usize,
    limit: usize,
) -> (Vec<Value>, usize) {
    let normal = |text: &str| -> String {
        text.chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .map(|c| c.to_ascii_uppercase())
            .collect()
    };
    let wanted = search.map(normal).filter(|wanted| !wanted.is_empty());
    let matches = |flight: &&Value| {
        let Some(wanted) = &wanted else {
            return true;
        };
        let text = |field: &str| match &flight[field] {
            Value::String(text) => text.clone(),
            Value::Number(number) => number.to_string(),
            _ => String::new(),
        };
        let number = text("flightNumber");
        let flight_id = format!("{}{number}", text("carrier"));
        *wanted == number || *wanted == normal(&flight_id) || *wanted == normal(&text("tailNumber"))
    };
    let matching: Vec<&Value> = flights.iter().filter(matches).collect();
    let total = matching.len();
    let shown = matching.into_iter().skip(offset).take(limit).cloned().collect();
    (shown, total)
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

/// Query parameters of `/api/alerts`.
#[derive(Debug, Deserialize)]
struct AlertsQuery {
    date: Option<String>,
}

async fn alerts(
    State(board): State<Board>,
    Query(query): Query<AlertsQuery>,
) -> Result<Json<Value>, ApiError> {
    let stores = board.stores().await?;
    let rows = board.alerts.get(&(), stores.alerts()).await?;
    Ok(Json(alert_board(&rows, query.date.as_deref())))
}

/// What the board shows of the alerts: the open ones (raised, not resolved; of flights of `date`
/// when given, by the flight key's service date), oldest first, and the counts.
pub fn alert_board(rows: &[Alert], date: Option<&str>) -> Value {
    let date = date.map(str::trim).filter(|date| !date.is_empty());
    let mut raised: HashMap<&str, &Alert> = HashMap::new();
    let mut resolved: HashMap<&str, &Alert> = HashMap::new();
    for alert in rows {
        if date.is_some_and(|date| !alert.flight_key.contains(&format!("-{date}-"))) {
            continue;
        }
        match alert.state() {
            AlertState::Firing => raised.insert(&alert.alert_id, alert),
            AlertState::Resolved => resolved.insert(&alert.alert_id, alert),
        };
    }
    let mut open: Vec<&Alert> = raised
        .iter()
        .filter(|(id, _)| !resolved.contains_key(*id))
        .map(|(_, alert)| *alert)
        .collect();
    open.sort_by(|a, b| (a.fired_at_us, &a.flight_key).cmp(&(b.fired_at_us, &b.flight_key)));
    let iso = |micros: i64| {
        chrono::DateTime::from_timestamp_micros(micros)
            .map(|time| time.format("%Y-%m-%dT%H:%M:%SZ").to_string())
    };
    json!({
        "open": open.iter().map(|alert| json!({
            "alertId": alert.alert_id,
            "kind": alert.kind,
            "flightKey": alert.flight_key,
            "firedAt": iso(alert.fired_at_us),
            "message": alert.message,
        })).collect::<Vec<_>>(),
        "raised": raised.len(),
        "resolved": resolved.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert(key: &str, minute: i64, state: AlertState) -> Alert {
        Alert {
            alert_id: format!("{key}/DEPARTURE_OVERDUE"),
            kind: "DEPARTURE_OVERDUE".to_owned(),
            flight_key: key.to_owned(),
            fired_at_us: 1_357_000_000_000_000 + minute * 60_000_000,
            state: state as i32,
            ..Alert::default()
        }
    }

    #[test]
    fn search_finds_a_flight_by_number_or_tail_and_pages_count_every_match() {
        let flights: Vec<Value> = (0..250)
            .map(|n| {
                json!({
                    "id": format!("UA{n}-2013-01-01-EWR"),
                    "carrier": if n % 2 == 0 { "UA" } else { "B6" },
                    "flightNumber": n,
                    "tailNumber": format!("N{n}UA"),
                })
            })
            .collect();
        let (shown, total) = flights_page(&flights, None, 200, 100);
        assert_eq!((shown.len(), total), (50, 250), "the last page holds the rest");
        assert_eq!(shown[0]["flightNumber"], 200);
        for search in ["UA 42", "ua-42", "42", "n42ua"] {
            let (shown, total) = flights_page(&flights, Some(search), 0, 100);
            assert_eq!(total, 1, "{search}");
            assert_eq!(shown[0]["flightNumber"], 42, "{search}");
        }
        assert_eq!(
            flights_page(&flights, Some("B6 42"), 0, 100).1,
            0,
            "UA42 is not B6's"
        );
        assert_eq!(
            flights_page(&flights, Some("  "), 0, 10).1,
            250,
            "blank: everything"
        );
    }

    /// With a token, every data route refuses requests without it; the page itself is served.
    #[tokio::test]
    async fn a_board_with_a_token_refuses_data_without_it() {
        let meta = Arc::new(RwLock::new(BoardMeta::default()));
        let board = Board::starting(meta).with_tokens(BearerTokens::new(&[Secret::new("board-secret")]));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let server = tokio::spawn(serve(board, listener, std::future::pending()));
        let client = reqwest::Client::new();
        let get = |path: &str, token: Option<&str>| {
            let mut request = client.get(format!("http://{address}{path}"));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            request.send()
        };
        for path in [
            "/api/meta",
            "/api/flights",
            "/api/alerts",
            "/api/flights/UA1-2013-01-01-EWR",
        ] {
            let status = get(path, None).await.expect("answers").status();
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path} without a token");
            let status = get(path, Some("wrong")).await.expect("answers").status();
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path} with a wrong token");
        }
        let meta = get("/api/meta", Some("board-secret")).await.expect("answers");
        assert_eq!(meta.status(), StatusCode::OK);
        let meta: Value = meta.json().await.expect("json");
        assert_eq!(meta["zones"]["EWR"], "America/New_York");
        let page = get("/", None).await.expect("answers");
        assert_eq!(page.status(), StatusCode::OK, "the page holds no data");
        server.abort();
    }

    #[test]
    fn open_alerts_are_the_raised_ones_not_resolved_oldest_first_of_the_date() {
        let rows = [
            alert("UA1-2013-01-01-EWR", 30, AlertState::Firing),
            alert("UA1-2013-01-01-EWR", 30, AlertState::Resolved),
            alert("AA2-2013-01-01-JFK", 20, AlertState::Firing),
            alert("B63-2013-01-01-JFK", 10, AlertState::Firing),
            // A copy of a raised alert (the table is exactly-once; the topic is not).
            alert("B63-2013-01-01-JFK", 10, AlertState::Firing),
            alert("DL4-2013-01-02-LGA", 5, AlertState::Firing),
        ];
        let board = alert_board(&rows, Some("2013-01-01"));
        let open: Vec<&str> = board["open"]
            .as_array()
            .expect("open")
            .iter()
            .map(|alert| alert["flightKey"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(open, ["B63-2013-01-01-JFK", "AA2-2013-01-01-JFK"]);
        assert_eq!(
            (board["raised"].as_u64(), board["resolved"].as_u64()),
            (Some(3), Some(1))
        );
        assert_eq!(alert_board(&rows, None)["open"].as_array().map(Vec::len), Some(3));
        assert_eq!(alert_board(&rows, Some(" "))["raised"].as_u64(), Some(4));
    }
}
