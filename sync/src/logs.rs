//! Container log rotation, as the kubelet's container log manager does it: every `containerLogMonitorInterval`, a
//! running container's log that reached `containerLogMaxSize` is moved aside to `<log>.<UTC timestamp>.<sequence>`,
//! after the oldest rotated files were removed to make room for it: there are never more than
//! `containerLogMaxFiles` (the live one counts), not even for the moment between a rotation and its cleanup. Age is the
//! sequence, one more than the highest there, not the timestamp: after the clock steps back, the newest files are
//! still the ones kept. How the live file is moved aside is the runtime's ([`crate::Runtime::rotate_log`]): copy and
//! truncate where the container holds the file open with `O_APPEND` (the process runtime), rename and
//! `ReopenContainerLog` under CRI.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

/// The log rotation settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRotation {
    /// `containerLogMaxSize` in bytes.
    pub max_size: u64,
    /// `containerLogMaxFiles`, the live file included (at least 2).
    pub max_files: u32,
    /// `containerLogMonitorInterval`.
    pub interval: Duration,
}

impl Default for LogRotation {
    fn default() -> Self {
        Self { max_size: 10 << 20, max_files: 5, interval: Duration::from_secs(10) }
    }
}

/// When a container's first log check runs: the first tick, at or after `now`, of a grid of `interval` laid from
/// `epoch`. Every container's checks then fall on the same ticks and wake the daemon once per interval, where ticks
/// of each container's own (from its start) woke it once per container: ten times a second with 100 pods.
pub fn first_check(epoch: Instant, now: Instant, interval: Duration) -> Instant {
    let period = interval.as_nanos();
    if period == 0 {
        return now;
    }
    let late = now.saturating_duration_since(epoch).as_nanos() % period;
    if late == 0 {
        return now;
    }
    now + Duration::from_nanos(u64::try_from(period - late).unwrap_or(u64::MAX))
}

/// The name a log is rotated to now: `<log>.<YYYYmmdd-HHMMSS>.<sequence>` (UTC), the sequence one more than the
/// highest of the files rotated before, so that names tell age whatever the clock did.
pub fn rotated_name(log: &Path) -> PathBuf {
    rotated_name_at(log, jiff::Timestamp::now())
}

fn rotated_name_at(log: &Path, now: jiff::Timestamp) -> PathBuf {
    let stamp = now.strftime("%Y%m%d-%H%M%S").to_string();
    let seq = rotated_keys(log).last().map_or(1, |((seq, _), _)| seq.saturating_add(1));
    PathBuf::from(format!("{}.{stamp}.{seq}", log.display()))
}

/// The rotated files of `log`, oldest first.
fn rotated(log: &Path) -> Vec<PathBuf> {
    rotated_keys(log).into_iter().map(|(_, p)| p).collect()
}

/// The rotated files of `log` with their (sequence, timestamp), oldest first. Files from versions that named them
/// `<stamp>` alone have sequence 0, and sort before every later one.
fn rotated_keys(log: &Path) -> Vec<((u64, String), PathBuf)> {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else { return Vec::new() };
    let prefix = format!("{}.", name.to_string_lossy());
    let mut out: Vec<((u64, String), PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix(&prefix)?;
            let (stamp, seq) = rest.split_once('.').map_or((rest, 0), |(s, n)| (s, n.parse().unwrap_or(0)));
            Some(((seq, stamp.to_owned()), e.path()))
        })
        .collect();
    out.sort();
    out
}

/// Removes the oldest rotated files of `log` so that at most `keep` are left.
pub fn prune(log: &Path, keep: u32) {
    let files = rotated(log);
    let keep = usize::try_from(keep).unwrap_or(usize::MAX);
    for old in files.iter().take(files.len().saturating_sub(keep)) {
        if let Err(e) = std::fs::remove_file(old) {
            tracing::debug!(file = %old.display(), error = %e, "cannot remove a rotated log");
        }
    }
}

/// Rotates `log` of container `id` through `runtime` when it is full. The oldest rotated files are removed first,
/// as the kubelet does, so that the file the rotation adds keeps the count at `containerLogMaxFiles`, the live file
/// included: a flood never finds more on disk than the operator allowed. A rotation that fails has then cost the
/// oldest rotated file, which the next rotation would have removed anyway.
pub async fn rotate_if_full<R: nodewarden_runtime::Runtime>(
    runtime: &R,
    id: &nodewarden_runtime::ContainerId,
    log: &Path,
    cfg: &LogRotation,
) {
    if !is_full(log, cfg) {
        return;
    }
    make_room(log, cfg);
    let to = rotated_name(log);
    match runtime.rotate_log(id, log, &to, cfg.max_size).await {
        Ok(()) => prune(log, cfg.max_files.saturating_sub(1)),
        Err(e) => tracing::warn!(container_id = %id, error = %e, "cannot rotate the container's log"),
    }
}

/// Removes the oldest rotated files of `log` so that one more rotation keeps it at `containerLogMaxFiles`.
fn make_room(log: &Path, cfg: &LogRotation) {
    prune(log, cfg.max_files.saturating_sub(2));
}

/// Removes from `dir`, one container's log directory, the logs of the runs before the last `keep` when run
/// `attempt` starts: `keep` is how many dead containers the container keeps now (see `container_gc`), as the
/// kubelet removes a dead container's log with it. Under the default policy (one dead container per container)
/// the previous run's log thus stays for `kubectl logs --previous`, and older runs' logs, rotated files included,
/// go: a container that crash-loops for a day keeps two runs' logs, not hundreds.
pub fn remove_older_runs(dir: &Path, attempt: u32, keep: usize) {
    let keep = u32::try_from(keep).unwrap_or(u32::MAX);
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(run) = name.to_str().and_then(run_of) else { continue };
        if run.saturating_add(keep) < attempt
            && let Err(err) = std::fs::remove_file(e.path())
        {
            tracing::debug!(file = %e.path().display(), error = %err, "cannot remove an old run's log");
        }
    }
}

/// The run a log file belongs to: `<run>.log`, or `<run>.log.<rotation>` for its rotated files.
fn run_of(name: &str) -> Option<u32> {
    let (run, rest) = name.split_once('.')?;
    (rest == "log" || rest.starts_with("log.")).then(|| run.parse().ok()).flatten()
}

/// Whether `log` has reached the size at which it is rotated.
pub fn is_full(log: &Path, cfg: &LogRotation) -> bool {
    std::fs::metadata(log).is_ok_and(|m| m.len() >= cfg.max_size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodewarden_runtime::copy_truncate;

    #[test]
    fn first_checks_fall_on_one_grid() {
        let epoch = Instant::now();
        let ten = Duration::from_secs(10);
        let at = |ms: u64| epoch + Duration::from_millis(ms);
        // Containers started at any moment have their first check on the next tick of the grid.
        for started in [1, 4_321, 9_999] {
            assert_eq!(first_check(epoch, at(started), ten), at(10_000), "{started}");
        }
        assert_eq!(first_check(epoch, at(25_000), ten), at(30_000));
        assert_eq!(first_check(epoch, at(30_000), ten), at(30_000), "on a tick: now");
        assert_eq!(first_check(epoch, epoch, ten), epoch);
        assert_eq!(first_check(epoch, at(7), Duration::ZERO), at(7), "no grid without an interval");
        // A time before the epoch (not expected) still gives a time not before now.
        assert!(first_check(at(5_000), epoch, ten) >= epoch);
    }

    #[test]
    fn rotates_by_copy_and_truncate_and_keeps_at_most_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let cfg = LogRotation { max_size: 1024, max_files: 3, interval: Duration::from_secs(1) };
        let mut writer = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        use std::io::Write;
        for round in 0..5 {
            writer.write_all(&vec![b'a' + round; 2048]).unwrap();
            assert!(is_full(&log, &cfg));
            make_room(&log, &cfg);
            copy_truncate(&log, &rotated_name(&log), cfg.max_size).unwrap();
            // Never more than max_files on disk, the live file included, not even before the cleanup.
            let on_disk = std::fs::read_dir(dir.path()).unwrap().count();
            assert!(on_disk <= 3, "round {round}: {on_disk} files");
            prune(&log, cfg.max_files - 1);
            assert!(!is_full(&log, &cfg));
        }
        // The writer goes on at the start of the truncated file.
        writer.write_all(b"after").unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "after");
        let kept = rotated(&log);
        assert_eq!(kept.len(), 2, "{kept:?}");
        // The newest two rounds are kept, each the newest max_size bytes of its round.
        let last = std::fs::read(kept.last().unwrap()).unwrap();
        assert!(last.iter().all(|b| *b == b'e') && last.len() == 1024);
        let before = std::fs::read(&kept[0]).unwrap();
        assert!(before.iter().all(|b| *b == b'd'));
    }

    #[test]
    fn older_runs_logs_are_removed_and_the_previous_run_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            "0.log",
            "0.log.20261207-101500.1",
            "1.log",
            "2.log",
            "2.log.20261207-101700.1",
            "3.log",
            ".1.log.20261207-101600.1.tmp",
            "notes",
            "x.log",
        ];
        for n in names {
            std::fs::write(dir.path().join(n), n).unwrap();
        }
        remove_older_runs(dir.path(), 3, 3);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), names.len(), "three dead kept: every run's log");
        remove_older_runs(dir.path(), 3, 1);
        let mut left: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        // Run 3 is live, run 2 ended last (kept with its rotated file), runs 0 and 1 are gone; others are not logs.
        assert_eq!(
            left,
            [".1.log.20261207-101600.1.tmp", "2.log", "2.log.20261207-101700.1", "3.log", "notes", "x.log"]
        );
        remove_older_runs(dir.path(), 1, 1);
        remove_older_runs(&dir.path().join("missing"), 9, 1);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 6, "the first restart keeps everything");
        remove_older_runs(dir.path(), 4, 0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3, "none kept: every earlier run's log goes");
    }

    #[test]
    fn after_the_clock_steps_back_the_newest_rotations_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let day = |d: i64| jiff::Timestamp::from_second(1_700_000_000 + d * 86_400).unwrap();
        // Rotated before the step (a day ahead), one by an earlier version (no sequence), then after it.
        std::fs::write(log.with_file_name("0.log.20231113-221320"), "oldest").unwrap();
        for (text, when) in [("before 1", day(1)), ("before 2", day(1)), ("after 1", day(0)), ("after 2", day(0))] {
            std::fs::write(rotated_name_at(&log, when), text).unwrap();
        }
        std::fs::write(dir.path().join(".0.log.20231114-221320.9.tmp"), "a copy under way").unwrap();
        prune(&log, 2);
        let kept: Vec<String> = rotated(&log).iter().map(|p| std::fs::read_to_string(p).unwrap()).collect();
        assert_eq!(kept, ["after 1", "after 2"]);
        assert_eq!(rotated_name_at(&log, day(0)).extension().unwrap(), "5", "the sequence goes on");
    }
}
