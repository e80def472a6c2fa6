//! A real Prometheus server (Debian's `prometheus`, installed by scripts/setup.sh) scraping stages
//! on loopback with the chart's shipped alert rules, for the monitoring tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::harness::process::{StageProcess, free_port};
use crate::harness::wait::{Probe, wait_until};

/// The rules file the chart ships.
pub fn shipped_rules() -> PathBuf {
    crate::workspace_root().join("deploy/helm/contrail/files/prometheus-rules.yaml")
}

/// A Prometheus process and its HTTP API.
pub struct Prometheus {
    /// The process.
    pub process: StageProcess,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

/// One alert as `/api/v1/alerts` reports it.
#[derive(Debug, Clone)]
pub struct Alert {
    /// `alertname`.
    pub name: String,
    /// `pending` or `firing`.
    pub state: String,
    /// Its labels.
    pub labels: serde_json::Value,
}

impl Prometheus {
    /// Starts Prometheus in `dir`, scraping each `(job, host:port)` every second with the shipped
    /// rules, evaluated every second, their `for:` durations shortened to `for_override` (the
    /// expressions are the shipped ones).
    pub fn start(dir: &Path, targets: &[(String, String)], for_override: &str) -> Result<Prometheus> {
        std::fs::create_dir_all(dir)?;
        let rules = std::fs::read_to_string(shipped_rules()).context("the shipped rules")?;
        let shortened: String = rules
            .lines()
            .map(|line| {
                if line.trim_start().starts_with("for: ") {
                    let indent = &line[..line.len() - line.trim_start().len()];
                    format!("{indent}for: {for_override}\n")
                } else {
                    format!("{line}\n")
                }
            })
            .collect();
        std::fs::write(dir.join("rules.yaml"), shortened)?;
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             rule_files: [rules.yaml]\nscrape_configs:\n",
        );
        for (job, address) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs: [{{ targets: [\"{address}\"] }}]\n"
            ));
        }
        std::fs::write(dir.join("prometheus.yml"), config)?;
        let port = free_port();
        let binary = which("prometheus")?;
        let process = StageProcess::spawn_with_args(
            &binary,
            &[
                format!("--config.file={}", dir.join("prometheus.yml").display()),
                format!("--storage.tsdb.path={}", dir.join("data").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
            ],
            &[],
            &dir.join("prometheus.log"),
        )?;
        let mut prometheus = Prometheus {
            process,
            url: format!("http://127.0.0.1:{port}"),
        };
        let ready = format!("{}/-/ready", prometheus.url);
        prometheus
            .process
            .wait_until("Prometheus ready", Duration::from_secs(60), || {
                Ok(crate::harness::http::answers_200(&ready))
            })?;
        Ok(prometheus)
    }

    /// `GET /api/v1/<path>`'s `data`.
    fn api(&self, path: &str) -> Result<serde_json::Value> {
        let response = get_http10(&format!("{}/api/v1/{path}", self.url))?;
        let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        let parsed: serde_json::Value =
            serde_json::from_str(body).with_context(|| format!("Prometheus answered {response}"))?;
        if parsed["status"] != "success" {
            bail!("Prometheus: {parsed}");
        }
        Ok(parsed["data"].clone())
    }

    /// The result vector of instant query `query`.
    pub fn query(&self, query: &str) -> Result<Vec<serde_json::Value>> {
        let data = self.api(&format!("query?query={}", encode(query)))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The active alerts (pending and firing).
    pub fn alerts(&self) -> Result<Vec<Alert>> {
        let data = self.api("alerts")?;
        Ok(data["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|alert| Alert {
                name: alert["labels"]["alertname"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                state: alert["state"].as_str().unwrap_or_default().to_owned(),
                labels: alert["labels"].clone(),
            })
            .collect())
    }

    /// Waits until `query` returns at least `count` series.
    pub fn wait_for_series(
        &self,
        query: &str,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<serde_json::Value>> {
        wait_until(&format!("{count} series of {query}"), timeout, || {
            let result = self.query(query)?;
            Ok(if result.len() >= count {
                Probe::Ready(result)
            } else {
                Probe::NotYet(format!("{} series: {result:?}", result.len()))
            })
        })
    }
}

/// `GET url` as HTTP/1.0, so the answer is not chunked (Go's server chunks HTTP/1.1 bodies over
/// 2 KiB, and a chunk may split a UTF-8 character); the whole answer.
fn get_http10(url: &str) -> Result<String> {
    use std::io::{Read, Write};
    let without_scheme = url.trim_start_matches("http://");
    let (host, path) = without_scheme.split_once('/').unwrap_or((without_scheme, ""));
    let mut stream = std::net::TcpStream::connect(host)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// The path of `program` on `PATH`.
fn which(program: &str) -> Result<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .with_context(|| format!("{program} is not on PATH (scripts/setup.sh installs it)"))
}

/// The pid of the process running `binary` whose environment says `CONTRAIL_LISTEN__HTTP=…:port`
/// (a stage `contrail up` started).
pub fn stage_pid(binary: &str, http_port: u16) -> Result<u32> {
    let wanted = format!("CONTRAIL_LISTEN__HTTP=127.0.0.1:{http_port}");
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(command) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let program = command.split(|byte| *byte == 0).next().unwrap_or_default();
        if !String::from_utf8_lossy(program).ends_with(&format!("/{binary}")) {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ
            .split(|byte| *byte == 0)
            .any(|variable| variable == wanted.as_bytes())
        {
            return Ok(pid);
        }
    }
    bail!("no {binary} process listening on http port {http_port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            encode("up{job=~\".*\"} == 1"),
            "up%7Bjob%3D~%22.%2A%22%7D%20%3D%3D%201"
        );
    }
}
