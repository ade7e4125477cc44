//! Reading the kernel's own files (procfs, sysfs, cgroupfs) whole. They say their size is 0, so the standard
//! library's whole-file read asks for their metadata and then reads 32 bytes first, doubling from there: ten
//! system calls for `memory.stat`. Read into one page instead, they take four (open, read, the read that ends it,
//! close), which counts on polls that read them several times a second.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use crate::error::{IoError, Op};

/// The first buffer: one page, larger than the files the daemon polls (a longer one, such as the `cgroup.procs` of
/// a busy cgroup, doubles it as often as it needs).
const FIRST_READ: usize = 4096;

/// Reads the kernel file at `path` as text.
pub(crate) fn read_text(path: &Path) -> Result<String, IoError> {
    let error = |e| IoError::new(Op::Read, path, e);
    let mut file = File::open(path).map_err(error)?;
    let mut buf = vec![0; FIRST_READ];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(error(e)),
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|e| error(io::Error::new(io::ErrorKind::InvalidData, e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_files_shorter_and_longer_than_a_page() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0, 1, FIRST_READ - 1, FIRST_READ, FIRST_READ + 1, 3 * FIRST_READ + 7] {
            let text: String = (0..len).map(|i| char::from(b'a' + u8::try_from(i % 26).unwrap())).collect();
            let p = dir.path().join(format!("f{len}"));
            std::fs::write(&p, &text).unwrap();
            assert_eq!(read_text(&p).unwrap(), text, "{len} bytes");
        }
        // A procfs file whole, as the kernel makes it.
        let meminfo = read_text(Path::new("/proc/self/status")).unwrap();
        assert!(meminfo.starts_with("Name:") && meminfo.ends_with('\n'));
    }

    #[test]
    fn missing_and_binary_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_text(&dir.path().join("missing")).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        let p = dir.path().join("bin");
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        assert!(read_text(&p).is_err());
    }
}
