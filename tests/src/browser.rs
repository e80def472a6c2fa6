//! A minimal W3C WebDriver client for headless Chromium, so tests can load a served page in a real
//! browser, read what it rendered and check that a screenshot shows more than an empty page.
//!
//! It speaks plain HTTP/JSON to a `chromedriver` child process (Debian packages `chromium` and
//! `chromium-driver`). The API is synchronous, for `#[test]` functions: every call blocks on a
//! private current-thread Tokio runtime, so a [`Browser`] must not be used or dropped inside an
//! async context. Screenshots are checked with [`summarize_png`], a small PNG decoder that needs no
//! image crate.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use reqwest::Method;
use serde_json::{Value, json};

use crate::{Probe, free_port};

/// Command-line switches for Chromium: headless, and runnable as root in a container without a GPU
/// or a large `/dev/shm`.
const CHROMIUM_ARGS: [&str; 5] = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
];

/// Overrides the Chromium binary found on `PATH`.
const CHROMIUM_ENV: &str = "CONTRAIL_CHROMIUM";
/// Overrides the chromedriver binary found on `PATH`.
const CHROMEDRIVER_ENV: &str = "CONTRAIL_CHROMEDRIVER";
const INSTALL_HINT: &str = "install the Debian packages chromium and chromium-driver";

/// How long chromedriver may take to answer `/status` as ready.
const DRIVER_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Bounds every WebDriver call; a cold Chromium start on a busy machine takes several seconds.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// Deleting the session on drop should not hold a failing test up for long.
const DELETE_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The W3C key under which an element reference is returned.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A headless Chromium session driven through a chromedriver child process.
///
/// Dropping it ends the session (which closes Chromium) and kills chromedriver.
pub struct Browser {
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
    /// `http://127.0.0.1:PORT/session/ID`.
    session_url: String,
    // Held for its `Drop`, which kills chromedriver after `Browser::drop` deleted the session.
    _driver: DriverProcess,
}

/// Kills chromedriver when dropped, also when starting the session fails halfway.
struct DriverProcess {
    child: Child,
    log_path: PathBuf,
}

impl DriverProcess {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for DriverProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Starts chromedriver on a free port, logging to `dir/chromedriver.log`, and opens a session
    /// with headless Chromium.
    ///
    /// Binaries come from `PATH` (`chromium`, `chromedriver`) unless `CONTRAIL_CHROMIUM` or
    /// `CONTRAIL_CHROMEDRIVER` name them.
    pub fn start(dir: &Path) -> Result<Browser> {
        let driver_binary = find_executable(CHROMEDRIVER_ENV, "chromedriver")?;
        let chromium_binary = find_executable(CHROMIUM_ENV, "chromium")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;

        let log_path = dir.join("chromedriver.log");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let port = free_port();
        // Without `--log-path`, chromedriver logs to stderr; both streams go to one file so start-up
        // failures (port taken, Chromium crashing) end up next to the command log.
        let child = Command::new(&driver_binary)
            .arg(format!("--port={port}"))
            .arg("--log-level=INFO")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", driver_binary.display()))?;
        let mut driver = DriverProcess { child, log_path };

        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the Tokio runtime of the WebDriver client")?;
        let client = reqwest::Client::builder()
            .timeout(COMMAND_TIMEOUT)
            .build()
            .context("building the WebDriver HTTP client")?;
        let driver_url = format!("http://127.0.0.1:{port}");

        wait_until_driver_ready(&runtime, &client, &driver_url, &mut driver)?;

        let capabilities = json!({
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": chromium_binary,
                        "args": CHROMIUM_ARGS,
                    },
                },
            },
        });
        let new_session_url = format!("{driver_url}/session");
        let session = runtime
            .block_on(send_command(
                &client,
                Method::POST,
                &new_session_url,
                Some(capabilities),
                None,
            ))
            .with_context(|| {
                format!(
                    "creating a Chromium session with {}; chromedriver log:\n{}",
                    chromium_binary.display(),
                    driver.log()
                )
            })?;
        let session_id = session
            .get("sessionId")
            .and_then(Value::as_str)
            .with_context(|| format!("new session answer has no sessionId: {session}"))?;

        Ok(Browser {
            runtime,
            client,
            session_url: format!("{driver_url}/session/{session_id}"),
            _driver: driver,
        })
    }

    /// Navigates to `url` and waits until the page has loaded (the WebDriver default).
    pub fn goto(&self, url: &str) -> Result<()> {
        self.command(Method::POST, "/url", Some(json!({ "url": url })))?;
        Ok(())
    }

    /// Runs `script` as the body of a function (`arguments[i]` are `args`) and converts what it
    /// returns.
    pub fn execute<T: serde::de::DeserializeOwned>(&self, script: &str, args: Vec<Value>) -> Result<T> {
        let returned = self.command(
            Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )?;
        serde_json::from_value(returned.clone())
            .with_context(|| format!("unexpected result of script {script:?}: {returned}"))
    }

    /// The `innerText` of every element matching the CSS selector `css`, in document order.
    pub fn texts(&self, css: &str) -> Result<Vec<String>> {
        self.execute(
            "return Array.from(document.querySelectorAll(arguments[0]), element => element.innerText);",
            vec![json!(css)],
        )
        .with_context(|| format!("reading the texts of {css:?}"))
    }

    /// Clicks the first element matching the CSS selector `css`, as a user would (scrolled into
    /// view, at its centre).
    pub fn click(&self, css: &str) -> Result<()> {
        let found = self
            .command(
                Method::POST,
                "/element",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .with_context(|| format!("finding {css:?}"))?;
        let element_id = found
            .get(ELEMENT_KEY)
            .and_then(Value::as_str)
            .with_context(|| format!("element answer for {css:?} has no reference: {found}"))?;
        self.command(Method::POST, &format!("/element/{element_id}/click"), None)
            .with_context(|| format!("clicking {css:?}"))?;
        Ok(())
    }

    /// Calls `probe` until it reports [`Probe::Ready`], for at most `timeout` (see
    /// [`crate::wait_until`]). Probe errors count as "not yet" (the page may still be loading); on
    /// timeout the error names `what` and what the probe saw (or the error it met) last.
    pub fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut probe: impl FnMut(&Browser) -> Result<Probe<T>>,
    ) -> Result<T> {
        crate::wait_until(what, timeout, || {
            Ok(match probe(self) {
                Ok(seen) => seen,
                Err(error) => Probe::NotYet(format!("probe error: {error:#}")),
            })
        })
    }

    /// A PNG screenshot of the viewport.
    pub fn screenshot_png(&self) -> Result<Vec<u8>> {
        let encoded = self.command(Method::GET, "/screenshot", None)?;
        let encoded = encoded
            .as_str()
            .with_context(|| format!("screenshot answer is not a string: {encoded:.200}"))?;
        decode_base64(encoded).context("decoding the screenshot")
    }

    /// Sends a command to this session (`path` starts with `/`) and returns the answer's `value`.
    fn command(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value> {
        let url = format!("{}{path}", self.session_url);
        self.runtime
            .block_on(send_command(&self.client, method, &url, body, None))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ending the session makes chromedriver close Chromium; killing only chromedriver would
        // leave Chromium's processes behind.
        let _ = self.runtime.block_on(send_command(
            &self.client,
            Method::DELETE,
            &self.session_url,
            None,
            Some(DELETE_SESSION_TIMEOUT),
        ));
    }
}

/// The executable named by the environment variable `env_override`, or `name` on `PATH`.
fn find_executable(env_override: &str, name: &str) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(env_override) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!(
                "{env_override}={} is not a file: {INSTALL_HINT} or fix {env_override}",
                path.display()
            );
        }
        return Ok(path);
    }
    let search_path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&search_path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .with_context(|| format!("{name} not found on PATH: {INSTALL_HINT} (or set {env_override})"))
}

/// Polls chromedriver's `/status` until it reports ready; fails early if the process exits.
fn wait_until_driver_ready(
    runtime: &tokio::runtime::Runtime,
    client: &reqwest::Client,
    driver_url: &str,
    driver: &mut DriverProcess,
) -> Result<()> {
    let status_url = format!("{driver_url}/status");
    let deadline = Instant::now() + DRIVER_READY_TIMEOUT;
    loop {
        if let Some(exit) = driver.child.try_wait()? {
            bail!(
                "chromedriver exited with {exit} before it was ready; its log:\n{}",
                driver.log()
            );
        }
        let status = runtime.block_on(send_command(
            client,
            Method::GET,
            &status_url,
            None,
            Some(Duration::from_secs(2)),
        ));
        let last_answer = match status {
            Ok(status) if status.get("ready") == Some(&Value::Bool(true)) => return Ok(()),
            Ok(status) => status.to_string(),
            Err(error) => format!("{error:#}"),
        };
        if Instant::now() >= deadline {
            bail!(
                "chromedriver at {driver_url} not ready after {DRIVER_READY_TIMEOUT:?} \
                 (last answer: {last_answer}); its log:\n{}",
                driver.log()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends one WebDriver request and returns the `value` of its answer, or the WebDriver error.
async fn send_command(
    client: &reqwest::Client,
    method: Method,
    url: &str,
    body: Option<Value>,
    timeout: Option<Duration>,
) -> Result<Value> {
    let mut request = client.request(method.clone(), url);
    if let Some(timeout) = timeout {
        request = request.timeout(timeout);
    }
    // WebDriver wants a JSON object as the body of every POST, even of commands without parameters.
    if method == Method::POST {
        request = request.json(&body.unwrap_or_else(|| json!({})));
    }
    let response = request.send().await.with_context(|| format!("{method} {url}"))?;
    let status = response.status();
    let text = response
        .text()
        .await
        .with_context(|| format!("{method} {url}: reading the answer"))?;
    let mut answer: Value = serde_json::from_str(&text)
        .with_context(|| format!("{method} {url}: answer (HTTP {status}) is not JSON: {text:.500}"))?;
    let value = answer.get_mut("value").map(Value::take).unwrap_or_default();
    // A successful answer's value may itself hold an "error" key (a script's result), so only the
    // status says whether the command failed.
    if !status.is_success() {
        let error = value
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("unknown error");
        let message = value.get("message").and_then(Value::as_str).unwrap_or(&text);
        bail!("{method} {url}: WebDriver error \"{error}\" (HTTP {status}): {message}");
    }
    Ok(value)
}

/// Decodes standard base64 (`A-Z a-z 0-9 + /`, `=` padding), as WebDriver returns screenshots.
fn decode_base64(text: &str) -> Result<Vec<u8>> {
    let unpadded = text.trim_end_matches('=');
    let padding = text.len() - unpadded.len();
    if padding > 2 || (padding > 0 && !text.len().is_multiple_of(4)) {
        bail!(
            "invalid base64 padding: {padding} '=' on {} characters",
            text.len()
        );
    }
    if unpadded.len() % 4 == 1 {
        bail!(
            "invalid base64 length: {} characters leave a dangling 6 bits",
            unpadded.len()
        );
    }
    let mut decoded = Vec::with_capacity(unpadded.len() / 4 * 3 + 2);
    let mut accumulator: u32 = 0;
    let mut pending_bits = 0;
    for (position, character) in unpadded.bytes().enumerate() {
        let sextet = match character {
            b'A'..=b'Z' => character - b'A',
            b'a'..=b'z' => character - b'a' + 26,
            b'0'..=b'9' => character - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => bail!(
                "invalid base64 character {:?} at position {position}",
                char::from(character)
            ),
        };
        accumulator = (accumulator << 6) | u32::from(sextet);
        pending_bits += 6;
        if pending_bits >= 8 {
            pending_bits -= 8;
            decoded.push((accumulator >> pending_bits) as u8);
            accumulator &= (1 << pending_bits) - 1;
        }
    }
    Ok(decoded)
}

/// What a PNG screenshot shows, enough to tell a rendered page from a blank one.
#[derive(Debug, Clone, PartialEq)]
pub struct PngSummary {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Number of distinct RGB colours (alpha ignored), at most [`DISTINCT_COLOUR_CAP`].
    pub distinct_colours: usize,
    /// Share of pixels (0 to 1) whose colour is not the most common one.
    pub non_background_share: f64,
}

/// [`summarize_png`] stops collecting new colours here: a photo-like screenshot would otherwise
/// cost a large set, and "thousands of colours" is all a test needs to know.
pub const DISTINCT_COLOUR_CAP: usize = 4096;

/// Summarizes a PNG: 8-bit RGB or RGBA, not interlaced (what Chromium's screenshots are).
///
/// Chunk CRCs are not checked; the structure (signature, chunk lengths, IHDR first, IDAT before
/// IEND) is.
pub fn summarize_png(bytes: &[u8]) -> Result<PngSummary> {
    let image = decode_png(bytes)?;
    Ok(summarize_pixels(image.width, image.height, &image.pixels))
}

fn summarize_pixels(width: u32, height: u32, pixels: &[[u8; 3]]) -> PngSummary {
    let mut pixels_per_colour: HashMap<[u8; 3], u64> = HashMap::new();
    for pixel in pixels {
        // Past the cap, colours not yet seen go uncounted; they are rare by construction, so they
        // cannot be the background.
        if let Some(count) = pixels_per_colour.get_mut(pixel) {
            *count += 1;
        } else if pixels_per_colour.len() < DISTINCT_COLOUR_CAP {
            pixels_per_colour.insert(*pixel, 1);
        }
    }
    let background_pixels = pixels_per_colour.values().copied().max().unwrap_or(0);
    let non_background_share = if pixels.is_empty() {
        0.0
    } else {
        1.0 - background_pixels as f64 / pixels.len() as f64
    };
    PngSummary {
        width,
        height,
        distinct_colours: pixels_per_colour.len(),
        non_background_share,
    }
}

const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
/// Refuses images whose raw data would exceed this, so a corrupt header cannot exhaust memory.
const MAX_RAW_IMAGE_BYTES: usize = 512 << 20;

/// A decoded image, row-major, alpha dropped.
struct DecodedImage {
    width: u32,
    height: u32,
    pixels: Vec<[u8; 3]>,
}

/// The IHDR fields the decoder supports.
struct ImageHeader {
    width: u32,
    height: u32,
    /// 3 for RGB (colour type 2), 4 for RGBA (colour type 6).
    bytes_per_pixel: usize,
}

fn decode_png(bytes: &[u8]) -> Result<DecodedImage> {
    let mut remaining = bytes
        .strip_prefix(&PNG_SIGNATURE)
        .context("not a PNG: the 8-byte signature is missing")?;
    let mut offset = PNG_SIGNATURE.len();
    let mut header: Option<ImageHeader> = None;
    let mut compressed = Vec::new();
    let mut seen_end = false;
    while !remaining.is_empty() {
        let Some((length, rest)) = remaining.split_first_chunk::<4>() else {
            bail!("truncated PNG chunk header at byte {offset}");
        };
        let Some((kind, rest)) = rest.split_first_chunk::<4>() else {
            bail!("truncated PNG chunk header at byte {offset}");
        };
        let length = u32::from_be_bytes(*length) as usize;
        let kind_name = String::from_utf8_lossy(kind);
        // data, then a 4-byte CRC
        if rest.len() < length.saturating_add(4) {
            bail!(
                "PNG chunk {kind_name} at byte {offset} claims {length} bytes but only {} remain",
                rest.len()
            );
        }
        let data = &rest[..length];
        if header.is_none() && kind != b"IHDR" {
            bail!("PNG chunk {kind_name} at byte {offset} comes before IHDR");
        }
        match kind {
            b"IHDR" if header.is_some() => bail!("second IHDR at byte {offset}"),
            b"IHDR" => header = Some(parse_header(data)?),
            b"IDAT" => compressed.extend_from_slice(data),
            b"IEND" => {
                seen_end = true;
                break;
            }
            _ => {}
        }
        remaining = &rest[length + 4..];
        offset += 12 + length;
    }
    let header = header.context("PNG has no IHDR chunk")?;
    if !seen_end {
        bail!("PNG ends without an IEND chunk");
    }

    let too_large = || {
        anyhow!(
            "PNG of {}x{} pixels is too large to decode",
            header.width,
            header.height
        )
    };
    let stride = (header.width as usize)
        .checked_mul(header.bytes_per_pixel)
        .ok_or_else(too_large)?;
    let raw_length = (stride + 1)
        .checked_mul(header.height as usize)
        .filter(|length| *length <= MAX_RAW_IMAGE_BYTES)
        .ok_or_else(too_large)?;
    let mut raw = Vec::with_capacity(raw_length);
    flate2::read::ZlibDecoder::new(compressed.as_slice())
        .take(raw_length as u64 + 1)
        .read_to_end(&mut raw)
        .context("inflating the PNG image data")?;
    if raw.len() != raw_length {
        bail!(
            "PNG image data inflates to {}{} bytes, IHDR ({}x{}, {} bytes per pixel) needs {raw_length}",
            if raw.len() > raw_length { "more than " } else { "" },
            raw.len().min(raw_length),
            header.width,
            header.height,
            header.bytes_per_pixel
        );
    }

    let mut pixels = Vec::with_capacity(header.width as usize * header.height as usize);
    let mut previous_row = vec![0u8; stride];
    for (row_index, filtered_row) in raw.chunks_exact_mut(stride + 1).enumerate() {
        let (filter_type, row) = filtered_row.split_first_mut().context("empty PNG row")?;
        unfilter_row(*filter_type, row, &previous_row, header.bytes_per_pixel)
            .with_context(|| format!("PNG row {row_index}"))?;
        pixels.extend(
            row.chunks_exact(header.bytes_per_pixel)
                .map(|pixel| [pixel[0], pixel[1], pixel[2]]),
        );
        previous_row.copy_from_slice(row);
    }
    Ok(DecodedImage {
        width: header.width,
        height: header.height,
        pixels,
    })
}

fn parse_header(data: &[u8]) -> Result<ImageHeader> {
    let &[
        w0,
        w1,
        w2,
        w3,
        h0,
        h1,
        h2,
        h3,
        bit_depth,
        colour_type,
        compression,
        filter_method,
        interlace,
    ] = data
    else {
        bail!("IHDR has {} bytes instead of 13", data.len());
    };
    let width = u32::from_be_bytes([w0, w1, w2, w3]);
    let height = u32::from_be_bytes([h0, h1, h2, h3]);
    if width == 0 || height == 0 {
        bail!("PNG has an empty size {width}x{height}");
    }
    if bit_depth != 8 {
        bail!("PNG bit depth {bit_depth} is not supported (only 8)");
    }
    let bytes_per_pixel = match colour_type {
        2 => 3,
        6 => 4,
        _ => bail!("PNG colour type {colour_type} is not supported (only 2 RGB and 6 RGBA)"),
    };
    if compression != 0 || filter_method != 0 {
        bail!("PNG compression method {compression} / filter method {filter_method} is unknown");
    }
    if interlace != 0 {
        bail!("interlaced PNGs (method {interlace}) are not supported");
    }
    Ok(ImageHeader {
        width,
        height,
        bytes_per_pixel,
    })
}

/// Undoes one PNG row filter in place; `previous` is the already unfiltered row above (zeros for
/// the first row).
fn unfilter_row(filter_type: u8, row: &mut [u8], previous: &[u8], bytes_per_pixel: usize) -> Result<()> {
    debug_assert_eq!(row.len(), previous.len());
    match filter_type {
        0 => {}
        1 => {
            for index in bytes_per_pixel..row.len() {
                row[index] = row[index].wrapping_add(row[index - bytes_per_pixel]);
            }
        }
        2 => {
            for (byte, above) in row.iter_mut().zip(previous) {
                *byte = byte.wrapping_add(*above);
            }
        }
        3 => {
            for index in 0..row.len() {
                let left = if index >= bytes_per_pixel {
                    row[index - bytes_per_pixel]
                } else {
                    0
                };
                let average = ((u16::from(left) + u16::from(previous[index])) / 2) as u8;
                row[index] = row[index].wrapping_add(average);
            }
        }
        4 => {
            for index in 0..row.len() {
                let (left, upper_left) = if index >= bytes_per_pixel {
                    (row[index - bytes_per_pixel], previous[index - bytes_per_pixel])
                } else {
                    (0, 0)
                };
                row[index] = row[index].wrapping_add(paeth_predictor(left, previous[index], upper_left));
            }
        }
        _ => bail!("unknown PNG filter type {filter_type}"),
    }
    Ok(())
}

/// The neighbour (left, above, upper left) closest to `left + above - upper_left`, ties in that
/// order (PNG specification, section 9.4).
fn paeth_predictor(left: u8, above: u8, upper_left: u8) -> u8 {
    let estimate = i16::from(left) + i16::from(above) - i16::from(upper_left);
    let distance_left = (estimate - i16::from(left)).abs();
    let distance_above = (estimate - i16::from(above)).abs();
    let distance_upper_left = (estimate - i16::from(upper_left)).abs();
    if distance_left <= distance_above && distance_left <= distance_upper_left {
        left
    } else if distance_above <= distance_upper_left {
        above
    } else {
        upper_left
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader, Write as _};
    use std::net::TcpListener;

    use super::*;

    const FILTER_NONE: u8 = 0;
    const FILTER_SUB: u8 = 1;
    const FILTER_UP: u8 = 2;
    const FILTER_AVERAGE: u8 = 3;
    const FILTER_PAETH: u8 = 4;

    /// 4x3 pixels: row 0 a ramp, row 1 with a repeated colour, row 2 mostly white (the background).
    fn sample_rows() -> Vec<Vec<[u8; 3]>> {
        vec![
            vec![[10, 20, 30], [60, 20, 250], [255, 0, 128], [10, 20, 30]],
            vec![[200, 200, 1], [0, 0, 0], [0, 0, 0], [7, 250, 3]],
            vec![[255, 255, 255], [255, 255, 255], [255, 255, 255], [60, 20, 250]],
        ]
    }

    /// A PNG encoder independent of the decoder: applies each row's filter forwards, as an encoder
    /// does, and writes real CRCs so the file is valid for any other reader too.
    fn encode_png(rows: &[Vec<[u8; 3]>], filters: &[u8], with_alpha: bool) -> Result<Vec<u8>> {
        let filtered = filter_rows(rows, filters, with_alpha)?;
        png_from_filtered_data(rows[0].len(), rows.len(), with_alpha, &filtered)
    }

    /// Each row as its filter type byte followed by the filtered bytes.
    fn filter_rows(rows: &[Vec<[u8; 3]>], filters: &[u8], with_alpha: bool) -> Result<Vec<u8>> {
        let bytes_per_pixel = if with_alpha { 4 } else { 3 };
        let raw_rows: Vec<Vec<u8>> = rows
            .iter()
            .map(|row| {
                row.iter()
                    .flat_map(|&[red, green, blue]| {
                        let alpha = with_alpha.then_some(255u8);
                        [red, green, blue].into_iter().chain(alpha)
                    })
                    .collect()
            })
            .collect();
        let mut filtered = Vec::new();
        for (row_index, (raw, filter)) in raw_rows.iter().zip(filters).enumerate() {
            let above = |index: usize| {
                row_index
                    .checked_sub(1)
                    .map_or(0, |previous| raw_rows[previous][index])
            };
            let left = |index: usize| {
                index
                    .checked_sub(bytes_per_pixel)
                    .map_or(0, |left_index| raw[left_index])
            };
            let upper_left = |index: usize| index.checked_sub(bytes_per_pixel).map_or(0, &above);
            filtered.push(*filter);
            for (index, &byte) in raw.iter().enumerate() {
                let (a, b, c) = (
                    i32::from(left(index)),
                    i32::from(above(index)),
                    i32::from(upper_left(index)),
                );
                let prediction = match *filter {
                    FILTER_NONE => 0,
                    FILTER_SUB => a,
                    FILTER_UP => b,
                    FILTER_AVERAGE => (a + b) / 2,
                    FILTER_PAETH => {
                        let p = a + b - c;
                        let (pa, pb, pc) = ((p - a).abs(), (p - b).abs(), (p - c).abs());
                        if pa <= pb && pa <= pc {
                            a
                        } else if pb <= pc {
                            b
                        } else {
                            c
                        }
                    }
                    other => bail!("test encoder has no filter {other}"),
                };
                filtered.push(byte.wrapping_sub(prediction as u8));
            }
        }
        Ok(filtered)
    }

    fn png_from_filtered_data(
        width: usize,
        height: usize,
        with_alpha: bool,
        filtered: &[u8],
    ) -> Result<Vec<u8>> {
        let mut compressor = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        compressor.write_all(filtered)?;
        let compressed = compressor.finish()?;

        let mut header = Vec::new();
        header.extend_from_slice(&u32::try_from(width)?.to_be_bytes());
        header.extend_from_slice(&u32::try_from(height)?.to_be_bytes());
        header.extend_from_slice(&[8, if with_alpha { 6 } else { 2 }, 0, 0, 0]);

        let mut png = PNG_SIGNATURE.to_vec();
        write_chunk(&mut png, b"IHDR", &header);
        write_chunk(&mut png, b"tEXt", b"Comment\0ignored by the decoder");
        // Split the image data over two IDAT chunks: the decoder must concatenate them.
        let (first_half, second_half) = compressed.split_at(compressed.len() / 2);
        write_chunk(&mut png, b"IDAT", first_half);
        write_chunk(&mut png, b"IDAT", second_half);
        write_chunk(&mut png, b"IEND", &[]);
        Ok(png)
    }

    fn write_chunk(png: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        png.extend_from_slice(&(data.len() as u32).to_be_bytes());
        png.extend_from_slice(kind);
        png.extend_from_slice(data);
        let mut crc = flate2::Crc::new();
        crc.update(kind);
        crc.update(data);
        png.extend_from_slice(&crc.sum().to_be_bytes());
    }

    #[test]
    fn decoder_undoes_every_row_filter() -> Result<()> {
        let rows = sample_rows();
        let expected: Vec<[u8; 3]> = rows.concat();
        let filter_sequences = [
            [FILTER_NONE, FILTER_SUB, FILTER_UP],
            [FILTER_PAETH, FILTER_PAETH, FILTER_PAETH],
            [FILTER_SUB, FILTER_AVERAGE, FILTER_PAETH],
            [FILTER_UP, FILTER_PAETH, FILTER_AVERAGE],
        ];
        for filters in filter_sequences {
            for with_alpha in [false, true] {
                let png = encode_png(&rows, &filters, with_alpha)?;
                let image = decode_png(&png)?;
                assert_eq!(
                    (image.width, image.height),
                    (4, 3),
                    "filters {filters:?}, alpha {with_alpha}"
                );
                assert_eq!(image.pixels, expected, "filters {filters:?}, alpha {with_alpha}");
            }
        }
        Ok(())
    }

    #[test]
    fn summary_counts_colours_and_background_share() -> Result<()> {
        let png = encode_png(&sample_rows(), &[FILTER_NONE, FILTER_SUB, FILTER_PAETH], false)?;
        let summary = summarize_png(&png)?;
        assert_eq!(summary.width, 4);
        assert_eq!(summary.height, 3);
        // (10,20,30) (60,20,250) (255,0,128) (200,200,1) (0,0,0) (7,250,3) (255,255,255)
        assert_eq!(summary.distinct_colours, 7);
        // White covers 3 of 12 pixels and is the most common colour.
        assert!((summary.non_background_share - 0.75).abs() < 1e-9, "{summary:?}");
        Ok(())
    }

    #[test]
    fn decoder_rejects_malformed_pngs() -> Result<()> {
        let rows = sample_rows();
        let png = encode_png(&rows, &[FILTER_NONE, FILTER_SUB, FILTER_UP], false)?;
        assert!(summarize_png(b"GIF89a").is_err(), "no signature");
        assert!(summarize_png(&png[..png.len() - 12]).is_err(), "no IEND");
        assert!(summarize_png(&png[..40]).is_err(), "truncated chunk");

        let mut sixteen_bit = png.clone();
        // Bit depth follows the signature (8), the chunk length and type (8), width and height (8).
        sixteen_bit[24] = 16;
        let error = format!("{:#}", summarize_png(&sixteen_bit).err().context("accepted")?);
        assert!(error.contains("bit depth 16"), "{error}");

        let mut filtered = filter_rows(&rows, &[FILTER_NONE, FILTER_SUB, FILTER_UP], false)?;
        let second_row_start = 1 + 4 * 3;
        filtered[second_row_start] = 5;
        let unknown_filter = png_from_filtered_data(4, 3, false, &filtered)?;
        let error = format!("{:#}", summarize_png(&unknown_filter).err().context("accepted")?);
        assert!(error.contains("unknown PNG filter type 5"), "{error}");

        let truncated_data = png_from_filtered_data(4, 3, false, &filtered[..20])?;
        assert!(summarize_png(&truncated_data).is_err(), "short image data");
        Ok(())
    }

    /// A minimal base64 encoder for round trips, independent of the decoder.
    fn encode_base64(bytes: &[u8]) -> String {
        const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut encoded = String::new();
        for group in bytes.chunks(3) {
            let word = group.iter().enumerate().fold(0u32, |word, (index, byte)| {
                word | u32::from(*byte) << (16 - 8 * index)
            });
            for sextet_index in 0..4 {
                if sextet_index <= group.len() {
                    let sextet = (word >> (18 - 6 * sextet_index)) & 0x3f;
                    encoded.push(char::from(ALPHABET[sextet as usize]));
                } else {
                    encoded.push('=');
                }
            }
        }
        encoded
    }

    #[test]
    fn base64_decodes_known_vectors_and_round_trips() -> Result<()> {
        assert_eq!(decode_base64("")?, b"");
        assert_eq!(decode_base64("TQ==")?, b"M");
        assert_eq!(decode_base64("TWE=")?, b"Ma");
        assert_eq!(decode_base64("TWFu")?, b"Man");
        assert_eq!(decode_base64("aGVsbG8gd29ybGQ=")?, b"hello world");
        assert_eq!(decode_base64("+/+/")?, [0xfb, 0xff, 0xbf]);
        let every_byte: Vec<u8> = (0..=255).collect();
        for length in [0, 1, 2, 3, 254, 255, 256] {
            let encoded = encode_base64(&every_byte[..length]);
            assert_eq!(decode_base64(&encoded)?, &every_byte[..length], "{encoded}");
        }
        Ok(())
    }

    #[test]
    fn base64_rejects_bad_input() {
        assert!(decode_base64("TQ=").is_err(), "padding without a full group");
        assert!(decode_base64("T===").is_err(), "three padding characters");
        assert!(decode_base64("TWFuT").is_err(), "dangling character");
        assert!(decode_base64("TW-u").is_err(), "URL-safe alphabet");
        assert!(decode_base64("TW u").is_err(), "whitespace");
    }

    /// The test page: fills `#x` after 300 ms, so the test must wait, and draws a coloured box so
    /// the screenshot is not one flat colour.
    const TEST_PAGE: &str = r##"<!doctype html>
<html>
<head><meta charset="utf-8"><title>contrail browser test</title></head>
<body style="margin: 0; background: #ffffff; font: 24px sans-serif; color: #111111">
<h1>contrail browser test</h1>
<ul id="x"></ul>
<button id="more" onclick="document.getElementById('status').textContent = 'clicked'">more</button>
<p id="status">not clicked</p>
<canvas id="box" width="400" height="300"></canvas>
<script>
setTimeout(() => {
  const list = document.getElementById("x");
  for (const label of ["alpha", "bravo", "charlie"]) {
    const item = document.createElement("li");
    item.textContent = label;
    list.appendChild(item);
  }
  const context = document.getElementById("box").getContext("2d");
  context.fillStyle = "#d03020";
  context.fillRect(0, 0, 400, 300);
  context.fillStyle = "#2040c0";
  context.fillRect(100, 75, 200, 150);
}, 300);
</script>
</body>
</html>
"##;

    /// Answers every request on a fresh local port with [`TEST_PAGE`]; the thread ends with the
    /// test process.
    fn serve_test_page() -> Result<String> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(&stream);
                // Read the request head; the page is the same whatever was asked.
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|read| read > 2) {
                    line.clear();
                }
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{TEST_PAGE}",
                    TEST_PAGE.len()
                );
                let _ = stream.write_all(response.as_bytes());
            }
        });
        Ok(format!("http://{address}/"))
    }

    #[test]
    fn headless_chromium_renders_a_page_and_takes_a_screenshot() -> Result<()> {
        let url = serve_test_page()?;
        let dir = std::env::temp_dir().join(crate::unique("browser"));
        let browser = Browser::start(&dir)?;
        browser.goto(&url)?;
        let items = browser.wait_for("three items in #x", Duration::from_secs(10), |browser| {
            let texts = browser.texts("#x li")?;
            Ok(if texts.len() == 3 {
                Probe::Ready(texts)
            } else {
                Probe::NotYet(format!("items {texts:?}"))
            })
        })?;
        assert_eq!(items, ["alpha", "bravo", "charlie"]);
        let title: String = browser.execute("return document.title;", vec![])?;
        assert_eq!(title, "contrail browser test");
        browser.click("#more")?;
        assert_eq!(browser.texts("#status")?, ["clicked"]);

        let png = browser.screenshot_png()?;
        std::fs::write(dir.join("screenshot.png"), &png)?;
        let summary = summarize_png(&png)?;
        eprintln!("screenshot in {}: {summary:?}", dir.display());
        assert!(summary.width >= 1000, "{summary:?}");
        assert!(summary.height >= 700, "{summary:?}");
        assert!(summary.distinct_colours >= 3, "{summary:?}");
        assert!(summary.non_background_share > 0.01, "{summary:?}");
        Ok(())
    }
}
