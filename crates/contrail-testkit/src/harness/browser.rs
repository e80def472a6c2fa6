//! Headless Chromium for tests, so a test can load a served page in a real browser, read what it
//! rendered and check that a screenshot shows more than an empty page.
//!
//! The WebDriver protocol is spoken by [`fantoccini`] to a `chromedriver` child process (Debian
//! packages `chromium` and `chromium-driver`); screenshots are decoded by the [`png`] crate. The
//! API is synchronous, for `#[test]` functions: every call blocks on a private current-thread Tokio
//! runtime, so a [`Browser`] must not be used or dropped inside an async context.

use std::collections::HashMap;
use std::fs::File;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use fantoccini::{Client, ClientBuilder, Locator};
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

/// How long chromedriver may take to listen on its port.
const DRIVER_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Bounds every WebDriver call; a cold Chromium start on a busy machine takes several seconds.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// Ending the session on drop should not hold a failing test up for long.
const CLOSE_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// A headless Chromium session driven through a chromedriver child process.
///
/// Dropping it ends the session (which closes Chromium) and kills chromedriver.
pub struct Browser {
    runtime: tokio::runtime::Runtime,
    client: Client,
    // Held for its `Drop`, which kills chromedriver after `Browser::drop` ended the session.
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

/// Runs one WebDriver call to completion on `runtime`, bounded by `timeout`.
fn block_on<T, E: std::fmt::Display>(
    runtime: &tokio::runtime::Runtime,
    timeout: Duration,
    what: &str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T> {
    // The timer needs the runtime's context: create it inside `block_on`.
    runtime
        .block_on(async { tokio::time::timeout(timeout, call).await })
        .map_err(|_| anyhow!("{what}: no answer within {timeout:?}"))?
        .map_err(|error| anyhow!("{what}: {error}"))
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
        let driver_address = format!("127.0.0.1:{port}");
        crate::wait_until("chromedriver listens", DRIVER_READY_TIMEOUT, || {
            if let Some(exit) = driver.child.try_wait()? {
                bail!(
                    "chromedriver exited with {exit} before it was ready; its log:\n{}",
                    driver.log()
                );
            }
            Ok(match std::net::TcpStream::connect(&driver_address) {
                Ok(_) => Probe::Ready(()),
                Err(error) => Probe::NotYet(format!("connect {driver_address}: {error}")),
            })
        })?;

        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the Tokio runtime of the WebDriver client")?;
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium_binary,
                "args": CHROMIUM_ARGS,
            },
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!("a JSON object literal");
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let driver_url = format!("http://{driver_address}");
        let client = block_on(
            &runtime,
            COMMAND_TIMEOUT,
            "creating a Chromium session",
            ClientBuilder::new(connector)
                .capabilities(capabilities)
                .connect(&driver_url),
        )
        .with_context(|| {
            format!(
                "Chromium {} through chromedriver at {driver_url}; chromedriver log:\n{}",
                chromium_binary.display(),
                driver.log()
            )
        })?;
        Ok(Browser {
            runtime,
            client,
            _driver: driver,
        })
    }

    /// Navigates to `url` and waits until the page has loaded (the WebDriver default).
    pub fn goto(&self, url: &str) -> Result<()> {
        self.call(&format!("loading {url}"), self.client.goto(url))
    }

    /// Runs `script` as the body of a function (`arguments[i]` are `args`) and converts what it
    /// returns.
    pub fn execute<T: serde::de::DeserializeOwned>(&self, script: &str, args: Vec<Value>) -> Result<T> {
        let returned = self.call(&format!("running {script:?}"), self.client.execute(script, args))?;
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
        // A page that re-renders (the board refreshes its rows every 2 s) can replace the element
        // between finding and clicking it ("stale element reference", seen in CI): find it again.
        for _ in 0..10 {
            let element = self.call(&format!("finding {css:?}"), self.client.find(Locator::Css(css)))?;
            let clicked = self.call(&format!("clicking {css:?}"), async {
                match element.click().await {
                    Ok(()) => Ok(true),
                    Err(error) if error.is_stale_element_reference() => Ok(false),
                    Err(error) => Err(error),
                }
            })?;
            if clicked {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("clicking {css:?}: the element was replaced before every one of 10 clicks")
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
        self.call("taking a screenshot", self.client.screenshot())
    }

    fn call<T, E: std::fmt::Display>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T> {
        block_on(&self.runtime, COMMAND_TIMEOUT, what, call)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ending the session makes chromedriver close Chromium; killing only chromedriver would
        // leave Chromium's processes behind.
        let _ = block_on(
            &self.runtime,
            CLOSE_SESSION_TIMEOUT,
            "ending the session",
            self.client.clone().close(),
        );
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

/// Refuses images whose decoded data would exceed this, so a corrupt header cannot exhaust memory.
const MAX_DECODED_BYTES: usize = 512 << 20;

/// Summarizes a PNG of any colour type and bit depth (decoded to 8-bit RGB(A) by the `png` crate).
pub fn summarize_png(bytes: &[u8]) -> Result<PngSummary> {
    let mut decoder = png::Decoder::new_with_limits(
        std::io::Cursor::new(bytes),
        png::Limits {
            bytes: MAX_DECODED_BYTES,
        },
    );
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().context("reading the PNG header")?;
    let size = reader
        .output_buffer_size()
        .context("the PNG's decoded size overflows")?;
    let mut buffer = vec![0; size];
    let frame = reader.next_frame(&mut buffer).context("decoding the PNG")?;
    let data = &buffer[..frame.buffer_size()];
    let pixels: Vec<[u8; 3]> = match frame.color_type {
        png::ColorType::Rgb => data.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect(),
        png::ColorType::Rgba => data.chunks_exact(4).map(|p| [p[0], p[1], p[2]]).collect(),
        png::ColorType::Grayscale => data.iter().map(|&g| [g, g, g]).collect(),
        png::ColorType::GrayscaleAlpha => data.chunks_exact(2).map(|p| [p[0], p[0], p[0]]).collect(),
        other => bail!("unexpected colour type {other:?} after expanding to 8-bit colour"),
    };
    Ok(summarize_pixels(frame.width, frame.height, &pixels))
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

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader, Write as _};
    use std::net::TcpListener;

    use super::*;

    /// 4x3 pixels: row 0 a ramp, row 1 with a repeated colour, row 2 mostly white (the background).
    fn sample_rows() -> Vec<Vec<[u8; 3]>> {
        vec![
            vec![[10, 20, 30], [60, 20, 250], [255, 0, 128], [10, 20, 30]],
            vec![[200, 200, 1], [0, 0, 0], [0, 0, 0], [7, 250, 3]],
            vec![[255, 255, 255], [255, 255, 255], [255, 255, 255], [60, 20, 250]],
        ]
    }

    fn encode_png(rows: &[Vec<[u8; 3]>], colour: png::ColorType) -> Result<Vec<u8>> {
        let mut png = Vec::new();
        let mut encoder = png::Encoder::new(&mut png, rows[0].len() as u32, rows.len() as u32);
        encoder.set_color(colour);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header()?;
        let data: Vec<u8> = rows
            .iter()
            .flatten()
            .flat_map(|pixel| match colour {
                png::ColorType::Rgba => vec![pixel[0], pixel[1], pixel[2], 255],
                _ => pixel.to_vec(),
            })
            .collect();
        writer.write_image_data(&data)?;
        writer.finish()?;
        Ok(png)
    }

    #[test]
    fn summary_counts_colours_and_background_share() -> Result<()> {
        for colour in [png::ColorType::Rgb, png::ColorType::Rgba] {
            let summary = summarize_png(&encode_png(&sample_rows(), colour)?)?;
            assert_eq!(summary.width, 4);
            assert_eq!(summary.height, 3);
            // (10,20,30) (60,20,250) (255,0,128) (200,200,1) (0,0,0) (7,250,3) (255,255,255)
            assert_eq!(summary.distinct_colours, 7, "{colour:?}");
            // White covers 3 of 12 pixels and is the most common colour.
            assert!((summary.non_background_share - 0.75).abs() < 1e-9, "{summary:?}");
        }
        Ok(())
    }

    #[test]
    fn malformed_pngs_are_errors_not_panics() -> Result<()> {
        let png = encode_png(&sample_rows(), png::ColorType::Rgb)?;
        assert!(summarize_png(b"GIF89a").is_err(), "no signature");
        assert!(summarize_png(&png[..40]).is_err(), "truncated image data");
        assert!(summarize_png(&[]).is_err(), "empty");
        Ok(())
    }

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
