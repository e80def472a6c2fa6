//! Helpers shared by the benchmark binaries (included with `#[path]`; not every binary uses all).
#![allow(dead_code)]

/// The `fraction` percentile of ascending `sorted` values (NaN when empty).
pub fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * fraction).round() as usize]
}

/// The `fraction` quantile of a Prometheus histogram in `metrics` (all label sets together), as
/// the upper bound of the bucket that reaches it (seconds).
pub fn histogram_quantile(metrics: &str, name: &str, fraction: f64) -> f64 {
    bucket_quantile(&histogram_buckets(metrics, name), fraction)
}

/// The `fraction` quantile of cumulative `(upper bound, count)` buckets in ascending order: the
/// upper bound of the first bucket that reaches it (NaN when empty).
pub fn bucket_quantile(buckets: &[(f64, f64)], fraction: f64) -> f64 {
    let total = buckets.last().map_or(0.0, |(_, count)| *count);
    buckets
        .iter()
        .find(|(_, count)| *count >= fraction * total)
        .map_or(f64::NAN, |(bound, _)| *bound)
}

/// The buckets of a histogram between two scrapes: `after`'s counts less `before`'s.
pub fn bucket_difference(before: &[(f64, f64)], after: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|(bound, count)| {
            let earlier = before
                .iter()
                .find(|(known, _)| known == bound)
                .map_or(0.0, |(_, count)| *count);
            (*bound, count - earlier)
        })
        .collect()
}

/// The cumulative `(upper bound, count)` buckets of a Prometheus histogram in `metrics` (all
/// label sets added up), ascending.
pub fn histogram_buckets(metrics: &str, name: &str) -> Vec<(f64, f64)> {
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in metrics
        .lines()
        .filter(|line| line.starts_with(&format!("{name}_bucket")))
    {
        let parsed = (|| {
            // `le` is a label of its own, not the end of another (`table="…"` ends in `le="`).
            let after = line
                .split(",le=\"")
                .nth(1)
                .or_else(|| line.split("{le=\"").nth(1))?;
            let le = after.split('"').next()?;
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, line.rsplit(' ').next()?.parse::<f64>().ok()?))
        })();
        if let Some((bound, count)) = parsed {
            match buckets.iter_mut().find(|(known, _)| *known == bound) {
                Some((_, total)) => *total += count,
                None => buckets.push((bound, count)),
            }
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// A counter from a stage's admin `Status` (0 when absent or unreachable).
pub fn counter(stage: &contrail_testkit::cosmos::CosmosStage, name: &str) -> f64 {
    stage
        .status()
        .ok()
        .and_then(|status| status.counters.get(name).copied())
        .unwrap_or(0.0)
}

/// A memory field of `/proc/<pid>/status` (`pid` "self" for this process), MiB: `VmHWM` (peak
/// resident) or `VmRSS` (resident now); `None` when the process or the field is gone.
pub fn status_mib(pid: &str, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
}

/// CPU time (user + system) a process has used so far, seconds, from `/proc/<pid>/stat`.
pub fn process_cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command name (which may hold spaces) follow its closing ')'; utime and
    // stime are the 14th and 15th fields of the line, in clock ticks (USER_HZ = 100).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    [11, 12]
        .iter()
        .filter_map(|index| fields.get(*index)?.parse::<f64>().ok())
        .sum::<f64>()
        / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_fields_are_read_by_their_exact_name() {
        // The resident size first: the peak read after it can only be as large or larger.
        let now = status_mib("self", "VmRSS").expect("this process has a resident size");
        let peak = status_mib("self", "VmHWM").expect("and a peak");
        assert!(now > 0.0 && now <= peak, "{now} ≤ {peak}");
        assert_eq!(status_mib("self", "VmHW"), None, "a prefix is not the field");
        assert_eq!(status_mib("0", "VmHWM"), None, "no such process");
    }

    #[test]
    fn quantiles_of_a_labelled_histogram_sum_the_label_sets() {
        let text = "# TYPE x histogram\n\
            x_bucket{table=\"a\",le=\"0.1\"} 1\n\
            x_bucket{table=\"a\",le=\"1\"} 2\n\
            x_bucket{table=\"a\",le=\"+Inf\"} 2\n\
            x_bucket{table=\"b\",le=\"0.1\"} 0\n\
            x_bucket{table=\"b\",le=\"1\"} 1\n\
            x_bucket{table=\"b\",le=\"+Inf\"} 2\n";
        assert_eq!(histogram_quantile(text, "x", 0.25), 0.1);
        assert_eq!(histogram_quantile(text, "x", 0.5), 1.0);
        assert_eq!(histogram_quantile(text, "x", 0.99), f64::INFINITY);
    }
}
