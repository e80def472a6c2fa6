//! The processes of a local platform: the broker, the Cosmos endpoint and the five stages as
//! child processes (as they run as pods), with their ports, settings, logs, restarts and the
//! chaos that kills them.

mod chaos;
mod layout;
mod platform;
mod process;

pub use chaos::ChaosPlan;
pub use contrail_common::topology::{MAX_LOCAL_INSTANCES, ROTATION_STAGES, STAGES, StageSpec};
pub use layout::{Ports, Replica, Scale, cosmos_config, parse_scale, shard_dir, stage_env};
pub use platform::{Platform, PlatformOptions, create_stores, start_broker, start_cosmos, start_stages};
pub use process::{Managed, nisshi_binary, send_signal, sibling_binary, tansu_binary, wait_for_port};
