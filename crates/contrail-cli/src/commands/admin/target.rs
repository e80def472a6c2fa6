//! Which stage `contrail admin` talks to: a stage name on this machine (its default admin port
//! shifted by `--port-offset`) or an address anywhere.

use anyhow::{Result, bail};
use contrail_common::topology::{self, StageSpec};
use serde_json::{Value, json};

/// A deployable stage and where its admin API listens by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    Ingest,
    DedupState,
    CosmosWriter,
    ChangefeedSync,
    DeltaArchiver,
    /// The knock-on delay extension's dedup-state deployment (`processor = "rotation"`).
    Rotation,
    /// The knock-on delay extension's cosmos-writer deployment (`input = "predictions"`).
    CosmosPredictions,
}

impl Stage {
    /// The five pipeline stages, in pipeline order (the order of the `status` summary).
    pub(super) const ALL: [Stage; 5] = [
        Stage::Ingest,
        Stage::DedupState,
        Stage::CosmosWriter,
        Stage::ChangefeedSync,
        Stage::DeltaArchiver,
    ];

    /// The knock-on delay extension's deployments (`contrail up --rotation`), after the five in
    /// the `status` summary, shown when something listens on their ports.
    pub(super) const EXTENSIONS: [Stage; 2] = [Stage::Rotation, Stage::CosmosPredictions];

    /// Every stage `--stage` accepts: the five, then the extension's.
    pub(super) fn every() -> impl Iterator<Item = Stage> {
        Stage::ALL.into_iter().chain(Stage::EXTENSIONS)
    }

    /// The names `--stage` accepts, comma-separated, for messages.
    pub(super) fn valid_names() -> String {
        let names: Vec<&str> = Stage::every().map(Stage::name).collect();
        names.join(", ")
    }

    /// Its name and default ports.
    fn spec(self) -> StageSpec {
        match self {
            Stage::Ingest => topology::INGEST,
            Stage::DedupState => topology::DEDUP_STATE,
            Stage::CosmosWriter => topology::COSMOS_WRITER,
            Stage::ChangefeedSync => topology::CHANGEFEED_SYNC,
            Stage::DeltaArchiver => topology::DELTA_ARCHIVER,
            Stage::Rotation => topology::ROTATION,
            Stage::CosmosPredictions => topology::COSMOS_PREDICTIONS,
        }
    }

    /// The stage's name, as in its binary and in `--stage`.
    pub(super) fn name(self) -> &'static str {
        self.spec().name
    }

    /// Parses a `--stage` value; the error names the bad value and lists the valid ones.
    pub(super) fn from_name(name: &str) -> Result<Stage, String> {
        Stage::every()
            .find(|stage| stage.name() == name)
            .ok_or_else(|| format!("unknown stage {name:?}: expected one of {}", Stage::valid_names()))
    }

    /// `http://127.0.0.1:PORT` of the stage's admin API with every port shifted by `port_offset`.
    pub(super) fn local_url(self, port_offset: u16) -> Result<String> {
        self.local_url_of(port_offset, 0)
    }

    /// [`Stage::local_url`] of instance `index` of the stage on this machine (`contrail up
    /// --scale`: the default ports + 100 per instance).
    pub(super) fn local_url_of(self, port_offset: u16, index: u16) -> Result<String> {
        Ok(local_url(self.local_port_of(port_offset, index)?))
    }

    /// The admin port of instance `index` of the stage on this machine, shifted by `port_offset`.
    pub(super) fn local_port_of(self, port_offset: u16, index: u16) -> Result<u16> {
        let default_port = self.spec().grpc_of(index);
        let Some(port) = default_port.checked_add(port_offset) else {
            bail!(
                "--port-offset {port_offset} moves the {} admin port {default_port} past 65535",
                self.name()
            );
        };
        Ok(port)
    }
}

/// `http://127.0.0.1:PORT`: an admin API on this machine.
pub(super) fn local_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// One admin API to call: its URL, and the stage it belongs to when known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) stage: Option<Stage>,
    pub(super) url: String,
}

impl Target {
    /// Who answers, for messages: the stage's name, or its address when only `--addr` was given.
    pub(super) fn name(&self) -> String {
        match self.stage {
            Some(stage) => stage.name().to_owned(),
            None => format!("the stage at {}", self.url),
        }
    }

    /// The binary the stage at this target reports (`reported`) when the target names an
    /// extension's deployment of it (`rotation` runs `dedup-state`); `None` for a pipeline stage,
    /// an unnamed target, or a report of another binary than the deployment runs.
    pub(super) fn extension_binary<'a>(&self, reported: &'a str) -> Option<&'a str> {
        let stage = self.stage?;
        (stage.name() != reported && stage.spec().binary == reported).then_some(reported)
    }

    /// "dedup-state admin API at http://…", for connection errors.
    pub(super) fn describe_api(&self) -> String {
        match self.stage {
            Some(stage) => format!("{} admin API at {}", stage.name(), self.url),
            None => format!("the admin API at {}", self.url),
        }
    }

    /// The `stage` and `address` fields every JSON answer starts with.
    pub(super) fn json_fields(&self) -> serde_json::Map<String, Value> {
        let mut fields = serde_json::Map::new();
        fields.insert("stage".to_owned(), json!(self.stage.map(Stage::name)));
        fields.insert("address".to_owned(), json!(self.url));
        fields
    }
}

/// Where `--stage`, `--addr` and `--port-offset` point; `None` when neither names a stage.
pub(super) fn resolve_target(
    stage: Option<Stage>,
    addr: Option<&str>,
    port_offset: u16,
) -> Result<Option<Target>> {
    let explicit_addr = addr.map(str::trim).filter(|addr| !addr.is_empty());
    if let Some(addr) = explicit_addr {
        let url = if addr.contains("://") {
            addr.to_owned()
        } else {
            format!("http://{addr}")
        };
        return Ok(Some(Target { stage, url }));
    }
    match stage {
        Some(stage) => Ok(Some(Target {
            stage: Some(stage),
            url: stage.local_url(port_offset)?,
        })),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_names_resolve_to_local_admin_urls() {
        let expected = [
            ("ingest", "http://127.0.0.1:9090"),
            ("dedup-state", "http://127.0.0.1:9091"),
            ("cosmos-writer", "http://127.0.0.1:9192"),
            ("changefeed-sync", "http://127.0.0.1:9193"),
            ("delta-archiver", "http://127.0.0.1:9194"),
            ("rotation", "http://127.0.0.1:9195"),
            ("cosmos-predictions", "http://127.0.0.1:9196"),
        ];
        for (name, url) in expected {
            let stage = Stage::from_name(name).expect("a valid stage name");
            assert_eq!(stage.name(), name);
            let target = resolve_target(Some(stage), None, 0)
                .expect("resolves")
                .expect("a target");
            assert_eq!(target.url, url);
            assert_eq!(target.stage, Some(stage));
        }
    }

    #[test]
    fn port_offset_shifts_the_port() {
        let target = resolve_target(Some(Stage::DedupState), None, 100)
            .expect("resolves")
            .expect("a target");
        assert_eq!(target.url, "http://127.0.0.1:9191");
        assert_eq!(
            Stage::DeltaArchiver.local_url(1000).expect("in range"),
            "http://127.0.0.1:10194"
        );
        let error = Stage::Ingest.local_url(60_000).expect_err("past 65535");
        assert!(error.to_string().contains("60000"), "{error}");
        assert!(error.to_string().contains("ingest"), "{error}");
    }

    #[test]
    fn bad_stage_name_is_named_with_the_valid_ones() {
        let error = Stage::from_name("dedup").expect_err("not a stage");
        assert!(error.contains("\"dedup\""), "{error}");
        for name in [
            "ingest",
            "dedup-state",
            "cosmos-writer",
            "changefeed-sync",
            "delta-archiver",
            "rotation",
            "cosmos-predictions",
        ] {
            assert!(error.contains(name), "{error} lacks {name}");
        }
        assert!(Stage::from_name("Ingest").is_err(), "names are case-sensitive");
    }

    #[test]
    fn addr_overrides_stage_and_defaults_to_http() {
        let target = resolve_target(
            Some(Stage::DedupState),
            Some("http://dedup-state-0.dedup-state:9091"),
            500,
        )
        .expect("resolves")
        .expect("a target");
        assert_eq!(target.url, "http://dedup-state-0.dedup-state:9091");
        assert_eq!(target.stage, Some(Stage::DedupState));

        let bare = resolve_target(None, Some(" dedup-state-1:9091 "), 0)
            .expect("resolves")
            .expect("a target");
        assert_eq!(bare.url, "http://dedup-state-1:9091");
        assert_eq!(bare.stage, None);
        assert_eq!(bare.name(), "the stage at http://dedup-state-1:9091");

        assert_eq!(resolve_target(None, None, 0).expect("resolves"), None);
        assert_eq!(resolve_target(None, Some("  "), 0).expect("resolves"), None);
    }
}
