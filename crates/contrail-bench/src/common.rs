//! Helpers shared by the benchmark binaries (included with `#[path]`).

/// The `fraction` percentile of ascending `sorted` values (NaN when empty).
pub fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * fraction).round() as usize]
}
