//! Sorted runs on disk and their merge: how `contrail backfill reprocess` puts a table bigger than
//! memory into event-time order. Each partition's chosen events, sorted, become one run file; the
//! runs are then merged (at most [`FAN_IN`] open at once, merging runs into longer runs first
//! when there are more), so memory holds one partition while reading and one event per run while
//! merging.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// Runs open at once while merging.
pub const FAN_IN: usize = 128;

/// Buffer of each run's reader and writer.
const BUFFER: usize = 64 * 1024;

/// One event to produce: its event time (µs), flight key, event id and the record as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    pub time_us: i64,
    pub key: String,
    pub id: String,
    pub payload: Vec<u8>,
}

impl Replayed {
    /// The order events are produced in: event time, then event id (the order the fold sorts
    /// by), then flight key.
    fn order(&self) -> (i64, &str, &str) {
        (self.time_us, &self.id, &self.key)
    }

    fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        out.write_all(&self.time_us.to_le_bytes())?;
        for part in [self.key.as_bytes(), self.id.as_bytes(), &self.payload] {
            let len = u32::try_from(part.len())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a field over 4 GiB"))?;
            out.write_all(&len.to_le_bytes())?;
            out.write_all(part)?;
        }
        Ok(())
    }

    /// The next event of a run; `None` at its end.
    fn read_from(input: &mut impl Read) -> io::Result<Option<Replayed>> {
        let mut time = [0u8; 8];
        match input.read_exact(&mut time) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(error) => return Err(error),
        }
        let mut part = || -> io::Result<Vec<u8>> {
            let mut len = [0u8; 4];
            input.read_exact(&mut len)?;
            let mut bytes = vec![0u8; u32::from_le_bytes(len) as usize];
            input.read_exact(&mut bytes)?;
            Ok(bytes)
        };
        let text = |bytes: Vec<u8>| {
            String::from_utf8(bytes).map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
        };
        Ok(Some(Replayed {
            time_us: i64::from_le_bytes(time),
            key: text(part()?)?,
            id: text(part()?)?,
            payload: part()?,
        }))
    }
}

/// Sorts `events` into produce order, each (flight key, event id) once.
pub fn in_replay_order(mut events: Vec<Replayed>) -> Vec<Replayed> {
    events.sort_by(|a, b| a.order().cmp(&b.order()));
    let mut seen = std::collections::HashSet::new();
    events.retain(|event| seen.insert((event.key.clone(), event.id.clone())));
    events
}

/// The run files of one reprocessing, in a directory of their own (removed when dropped).
#[derive(Debug)]
pub struct Runs {
    dir: tempfile::TempDir,
    runs: Vec<PathBuf>,
    events: u64,
    bytes: u64,
}

impl Runs {
    /// Runs in a new directory under `parent`.
    pub fn new(parent: &Path) -> io::Result<Runs> {
        Ok(Runs {
            dir: tempfile::Builder::new()
                .prefix("contrail-reprocess-")
                .tempdir_in(parent)?,
            runs: Vec::new(),
            events: 0,
            bytes: 0,
        })
    }

    /// Events written.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Bytes of the run files.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn next_path(&self) -> PathBuf {
        self.dir.path().join(format!("run-{}", self.runs.len()))
    }

    /// Writes `events`, already in produce order, as a run.
    pub fn add(&mut self, events: &[Replayed]) -> io::Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let path = self.next_path();
        let mut out = BufWriter::with_capacity(BUFFER, File::create(&path)?);
        for event in events {
            event.write_to(&mut out)?;
            self.bytes += 20 + (event.key.len() + event.id.len() + event.payload.len()) as u64;
        }
        out.into_inner()
            .map_err(io::IntoInnerError::into_error)?
            .sync_all()?;
        self.runs.push(path);
        self.events += events.len() as u64;
        Ok(())
    }

    /// Every event of every run, in produce order (across runs too), each (flight key, event
    /// id) once: a flight's events are all in one run.
    pub fn merged(mut self) -> io::Result<Merged> {
        // More runs than may be open at once: merge the oldest into longer runs first.
        while self.runs.len() > FAN_IN {
            let group: Vec<PathBuf> = self.runs.drain(..FAN_IN).collect();
            let path = self
                .dir
                .path()
                .join(format!("merged-{}", self.runs.len() + FAN_IN));
            let mut out = BufWriter::with_capacity(BUFFER, File::create(&path)?);
            let mut merger = Merger::open(&group)?;
            while let Some(event) = merger.next_event()? {
                event.write_to(&mut out)?;
            }
            out.into_inner()
                .map_err(io::IntoInnerError::into_error)?
                .sync_all()?;
            for run in group {
                std::fs::remove_file(run)?;
            }
            self.runs.push(path);
        }
        Ok(Merged {
            merger: Merger::open(&self.runs)?,
            _dir: self.dir,
        })
    }
}

/// The runs' events in produce order; the run files go when it is dropped.
pub struct Merged {
    merger: Merger,
    _dir: tempfile::TempDir,
}

impl Merged {
    /// The next event; `None` after the last.
    pub fn next_event(&mut self) -> io::Result<Option<Replayed>> {
        self.merger.next_event()
    }
}

/// A k-way merge of sorted runs: the head of each run in a heap.
struct Merger {
    readers: Vec<BufReader<File>>,
    heads: Vec<Option<Replayed>>,
    heap: BinaryHeap<Reverse<(i64, String, String, usize)>>,
}

impl Merger {
    fn open(runs: &[PathBuf]) -> io::Result<Merger> {
        let mut merger = Merger {
            readers: Vec::with_capacity(runs.len()),
            heads: Vec::with_capacity(runs.len()),
            heap: BinaryHeap::with_capacity(runs.len()),
        };
        for path in runs {
            merger
                .readers
                .push(BufReader::with_capacity(BUFFER, File::open(path)?));
            merger.heads.push(None);
            merger.advance(merger.readers.len() - 1)?;
        }
        Ok(merger)
    }

    fn advance(&mut self, run: usize) -> io::Result<()> {
        if let Some(event) = Replayed::read_from(&mut self.readers[run])? {
            self.heap
                .push(Reverse((event.time_us, event.id.clone(), event.key.clone(), run)));
            self.heads[run] = Some(event);
        }
        Ok(())
    }

    fn next_event(&mut self) -> io::Result<Option<Replayed>> {
        let Some(Reverse((_, _, _, run))) = self.heap.pop() else {
            return Ok(None);
        };
        let event = self.heads[run].take();
        self.advance(run)?;
        Ok(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(time_us: i64, key: &str, id: &str) -> Replayed {
        Replayed {
            time_us,
            key: key.to_owned(),
            id: id.to_owned(),
            payload: format!("{key}/{id}").into_bytes(),
        }
    }

    #[test]
    fn events_go_out_in_event_time_order_each_once() {
        let ordered = in_replay_order(vec![
            event(30, "B", "b2"),
            event(10, "A", "a1"),
            event(20, "B", "b1"),
            event(10, "A", "a1"),
            event(10, "C", "c0"),
        ]);
        let ids: Vec<&str> = ordered.iter().map(|event| event.id.as_str()).collect();
        assert_eq!(ids, ["a1", "c0", "b1", "b2"]);
    }

    /// More runs than [`FAN_IN`], interleaved in time: the merge gives the one sorted sequence
    /// written out here by hand (time = run + 1,000 × i), every event once, payloads intact.
    #[test]
    fn runs_beyond_the_fan_in_merge_into_one_ordered_sequence() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut runs = Runs::new(dir.path()).expect("runs");
        let count = FAN_IN * 2 + 3;
        for run in 0..count {
            let events: Vec<Replayed> = (0..5)
                .map(|i| event(run as i64 + 1_000 * i, &format!("F{run}"), &format!("e{i}")))
                .collect();
            runs.add(&events).expect("add");
        }
        runs.add(&[]).expect("an empty run is no run");
        assert_eq!(runs.events(), (count * 5) as u64);
        let mut merged = runs.merged().expect("merge");
        let mut out = Vec::new();
        while let Some(event) = merged.next_event().expect("next") {
            out.push(event);
        }
        let mut expected = Vec::new();
        for i in 0..5 {
            for run in 0..count {
                expected.push(event(
                    run as i64 + 1_000 * i,
                    &format!("F{run}"),
                    &format!("e{i}"),
                ));
            }
        }
        assert_eq!(out.len(), expected.len());
        assert!(out == expected, "the merge is out of order");
    }

    #[test]
    fn a_truncated_run_is_an_error_not_an_end() {
        let mut bytes = Vec::new();
        event(1, "K", "id").write_to(&mut bytes).expect("write");
        let whole = Replayed::read_from(&mut bytes.as_slice()).expect("read");
        assert_eq!(whole, Some(event(1, "K", "id")));
        let cut = &bytes[..bytes.len() - 2];
        assert!(Replayed::read_from(&mut &cut[..]).is_err());
    }
}
