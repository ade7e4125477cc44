//! A container log file rotated in place, for a runtime whose containers hold their log open with `O_APPEND`.

use std::path::Path;

/// Copies the newest `keep` bytes of `log` (from the start of a line) to `to`, through a hidden file so that `to`
/// appears whole, then truncates `log`: the way to rotate a file that a process keeps open with `O_APPEND` (its
/// next write lands at the new end). A flood that outran the rotation costs at most `keep` more bytes of disk,
/// not a second copy of itself; what is older than that, and what is written after the rotation began, is lost.
pub fn copy_truncate(log: &Path, to: &Path, keep: u64) -> std::io::Result<()> {
    use std::io::{BufRead, Read, Seek, SeekFrom};
    let name = to.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = to.with_file_name(format!(".{name}.tmp"));
    let copy = || -> std::io::Result<()> {
        let mut src = std::fs::File::open(log)?;
        let len = src.metadata()?.len();
        let mut out = std::fs::File::create(&tmp)?;
        // Up to the end as it was when the rotation began: a writer that goes on does not make the copy chase it.
        let mut count = len.min(keep);
        if len > keep {
            // From the first line that starts in the newest `keep` bytes; from the cut itself if none does.
            let cut = len - keep;
            src.seek(SeekFrom::Start(cut - 1))?;
            let mut before = [0u8];
            src.read_exact(&mut before)?;
            if before[0] != b'\n' {
                let mut reader = std::io::BufReader::new(&mut src);
                let skipped = (&mut reader).take(keep).skip_until(b'\n')?;
                let skipped = u64::try_from(skipped).unwrap_or(keep);
                if skipped < keep {
                    count = keep - skipped;
                }
            }
            src.seek(SeekFrom::Start(len - count))?;
        }
        std::io::copy(&mut (&mut src).take(count), &mut out)?;
        std::fs::rename(&tmp, to)
    };
    if let Err(e) = copy() {
        let _ = std::fs::remove_file(&tmp);
        if e.kind() == std::io::ErrorKind::StorageFull {
            // No room for the copy: the live log goes, so that a container that floods a full disk does not keep
            // it full (the kubelet's rotation would not have left it to grow either).
            tracing::warn!(log = %log.display(), "no space to rotate the container's log; truncating it");
            std::fs::OpenOptions::new().write(true).open(log)?.set_len(0)?;
        }
        return Err(e);
    }
    std::fs::OpenOptions::new().write(true).open(log)?.set_len(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_rotated_to_its_newest_lines_from_a_line_start() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let lines: String = (0..1000).map(|i| format!("line {i:04}\n")).collect();
        std::fs::write(&log, &lines).unwrap();
        let to = log.with_file_name("0.log.1");
        copy_truncate(&log, &to, 105).unwrap();
        // 105 bytes reach into line 0989; the copy starts at the next whole line.
        let text = std::fs::read_to_string(&to).unwrap();
        assert_eq!(text, (990..1000).map(|i| format!("line {i:04}\n")).collect::<String>());
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        // A cut that falls on a line's start keeps that line.
        std::fs::write(&log, &lines).unwrap();
        copy_truncate(&log, &to, 110).unwrap();
        assert!(std::fs::read_to_string(&to).unwrap().starts_with("line 0989\n"));
        // One line longer than what is kept: the newest part of it.
        let long = format!("{}\n", "x".repeat(20_000));
        std::fs::write(&log, &long).unwrap();
        copy_truncate(&log, &to, 10_000).unwrap();
        assert_eq!(std::fs::read_to_string(&to).unwrap(), long[long.len() - 10_000..]);
        // Lines longer than a read buffer: the cut skips to the next whole one.
        let lines: String = (b'a'..=b'c').map(|c| format!("{}\n", char::from(c).to_string().repeat(9_999))).collect();
        std::fs::write(&log, &lines).unwrap();
        copy_truncate(&log, &to, 15_000).unwrap();
        assert_eq!(std::fs::read_to_string(&to).unwrap(), format!("{}\n", "c".repeat(9_999)));
    }
}
