//! The atomic writer of configMap, secret, downwardAPI and projected volumes, with the kubelet's on-disk layout, so
//! that a container reading the volume never sees a half-updated set of files:
//!
//! ```text
//! <dir>/..2026_12_07_00_41_09.1234567890/   one version's files: `..`, its UTC time, a unique suffix
//! <dir>/..data -> ..2026_12_07_00_41_09.1234567890
//! <dir>/<name> -> ..data/<name>              one link per top-level name of the payload
//! ```
//!
//! A new version is written whole into a directory of its own, then `..data` is switched to it by one rename: any
//! path read through the links resolves in the old version or in the new one, never in a mix of both. The names
//! starting with `..` are the writer's; a payload cannot use them. As the kubelet's, the writer is not safe for
//! concurrent use: the caller writes one volume from one place at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The link to the current version, in the target directory.
pub(crate) const DATA_DIR: &str = "..data";
/// The link that becomes `..data` by a rename.
const DATA_TMP: &str = "..data_tmp";
/// The longest payload path, in bytes.
const MAX_PATH_BYTES: usize = 4096;
/// The longest component of a payload path, in bytes.
const MAX_NAME_BYTES: usize = 255;
/// The mode of the directories the writer makes (searchable by a container of any user).
const DIR_MODE: u32 = 0o755;

/// One file of a volume's payload.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct FileProjection {
    /// The file's content.
    pub data: Vec<u8>,
    /// The file's mode; its permission bits (`mode & 0o7777`) are set exactly, whatever the umask.
    pub mode: u32,
    /// The user that owns the file; `None`: the daemon's.
    pub owner: Option<u32>,
    /// The group that owns the file, and the directories of its version (set-group-ID, so that anything made
    /// in them is too); `None`: the daemon's.
    pub group: Option<u32>,
}

impl FileProjection {
    /// `data` with mode `mode`, owned by the daemon.
    pub(crate) fn new(data: Vec<u8>, mode: u32) -> Self {
        Self { data, mode, owner: None, group: None }
    }
}

/// Shows the length of the content, never the content: a secret's bytes must not reach a log.
impl std::fmt::Debug for FileProjection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileProjection")
            .field("len", &self.data.len())
            .field("mode", &format_args!("{:#o}", self.mode))
            .finish()
    }
}

/// Why a volume's payload was not written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AtomicWriteError {
    /// A path of the payload is refused; nothing was written.
    #[error("invalid payload path {path:?}: {reason}")]
    InvalidPath {
        /// The path, as given.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Something the writer did not make (a file, a directory, a link elsewhere) is where the link of one of the
    /// payload's top-level names goes. It is kept, and nothing was written.
    #[error("{}: not a link into {DATA_DIR}, kept; the payload's {name:?} cannot be shown there", path.display())]
    Occupied {
        /// The user-visible path.
        path: PathBuf,
        /// The payload's top-level name.
        name: String,
    },
    /// One of the writer's own names holds something the writer does not make.
    #[error("{}: {what}", path.display())]
    Unexpected {
        /// The path.
        path: PathBuf,
        /// What was found.
        what: String,
    },
    /// A file system operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path operated on.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

/// Maps an I/O error on `path` to an [`AtomicWriteError::Io`].
fn at(path: &Path) -> impl FnOnce(std::io::Error) -> AtomicWriteError + '_ {
    move |source| AtomicWriteError::Io { path: path.to_path_buf(), source }
}

/// Writes `payload` (relative path -> file) into `dir` atomically. Returns whether anything changed.
///
/// The payload is checked whole first: a refused path, or a top-level name taken by something the writer did not
/// make, changes nothing. `dir` is made (mode 0755, with its parents) when missing; where the files name a group
/// (the pod's `fsGroup`), `dir` and the version directories are given to it, set-group-ID. When the current
/// version holds exactly the payload (the same paths, bytes, permission bits, owners and groups) no version is
/// written: the links are only repaired if an interrupted write left some missing or stale, and `Ok(true)` then
/// says they were. Otherwise a new
/// version is written, its links are made, `..data` is switched to it by one rename, then the links of names no
/// longer in the payload and the previous version are removed. An interrupted write leaves the previous version
/// readable through `..data`, and the next write finishes or undoes what it left.
pub(crate) fn write(dir: &Path, payload: &BTreeMap<String, FileProjection>) -> Result<bool, AtomicWriteError> {
    let files = validate(payload)?;
    let visible: BTreeSet<&str> = files.keys().map(|p| top_level(p)).collect();
    let group = files.values().find_map(|f| f.group);
    make_target_dir(dir)?;
    if let Some(group) = group {
        own_dir(dir, group)?;
    }
    let old = match data_link(dir)? {
        Some(DataLink::Version(name)) => Some(name),
        Some(DataLink::Other(target)) => {
            // Replaced by the switch below; whatever it points to is left alone.
            tracing::warn!(dir = %dir.display(), target = %target.display(), "..data is not a link to a version here");
            None
        }
        None => None,
    };
    // Before anything is written: a name the payload needs that is taken by something else refuses the payload.
    visible_links(dir, &visible, false)?;
    if let Some(old) = &old
        && holds_exactly(&dir.join(old), &files)
    {
        return tidy(dir, &visible, old);
    }

    let new = new_version_dir(dir)?;
    let new_path = dir.join(&new);
    if let Err(e) = group.map_or(Ok(()), |g| own_dir(&new_path, g)).and_then(|()| fill(&new_path, &files, group)) {
        remove_quietly(&new_path);
        return Err(e);
    }
    // Made before the switch, so that the payload's new names resolve from the switch on (until then, a link to a
    // name the current version lacks resolves to nothing, as a missing file).
    visible_links(dir, &visible, true)?;
    switch_data(dir, &new).inspect_err(|_| remove_quietly(&new_path))?;
    tracing::debug!(dir = %dir.display(), version = %new, files = files.len(), "switched to a new version");
    tidy(dir, &visible, &new)?;
    if let Some(old) = old {
        let old_path = dir.join(old);
        match std::fs::remove_dir_all(&old_path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(at(&old_path)(e)),
        }
    }
    Ok(true)
}

/// The files of the version `..data` links to in `dir`, by path; `None` when there is no `..data` (nothing was
/// written yet). Modes are the permission bits only (`& 0o7777`). Nothing is read through a symbolic link: a
/// `..data` that is not a link to a version directory of `dir`, or a version holding anything but directories and
/// regular files, is an error.
#[cfg(test)]
pub(crate) fn current(dir: &Path) -> Result<Option<BTreeMap<String, FileProjection>>, AtomicWriteError> {
    let root = match data_link(dir)? {
        None => return Ok(None),
        Some(DataLink::Other(target)) => {
            return Err(AtomicWriteError::Unexpected {
                path: dir.join(DATA_DIR),
                what: format!("links to {}, not to a version directory of {}", target.display(), dir.display()),
            });
        }
        Some(DataLink::Version(name)) => dir.join(name),
    };
    let Some(found) = files_under(&root)? else {
        return Err(AtomicWriteError::Unexpected {
            path: root,
            what: "holds something other than directories and regular files (or a name that is not UTF-8)".into(),
        });
    };
    let mut out = BTreeMap::new();
    for (rel, (path, _)) in found {
        let (data, mode) = read_regular(&path, None).map_err(at(&path))?;
        out.insert(rel, FileProjection::new(data, mode));
    }
    Ok(Some(out))
}

/// The payload with its paths cleaned (empty and `.` components dropped, as the kubelet cleans them), or the
/// first path refused.
fn validate(payload: &BTreeMap<String, FileProjection>) -> Result<BTreeMap<String, &FileProjection>, AtomicWriteError> {
    let mut clean: BTreeMap<String, (&str, &FileProjection)> = BTreeMap::new();
    for (path, file) in payload {
        let bad = |reason: &str| AtomicWriteError::InvalidPath { path: path.clone(), reason: reason.to_owned() };
        if path.is_empty() {
            return Err(bad("must not be empty"));
        }
        if path.starts_with('/') {
            return Err(bad("must be a relative path"));
        }
        if path.len() > MAX_PATH_BYTES {
            return Err(bad(&format!("must be at most {MAX_PATH_BYTES} bytes long")));
        }
        if path.contains('\0') {
            return Err(bad("must not contain a NUL byte"));
        }
        let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
        if parts.contains(&"..") {
            return Err(bad("must not contain a '..' component"));
        }
        if parts.iter().any(|c| c.len() > MAX_NAME_BYTES) {
            return Err(bad(&format!("each component must be at most {MAX_NAME_BYTES} bytes long")));
        }
        let Some(first) = parts.first() else { return Err(bad("must name a file")) };
        if first.starts_with("..") {
            return Err(bad("must not start with '..' (those names are the writer's)"));
        }
        if let Some((other, _)) = clean.insert(parts.join("/"), (path, file)) {
            return Err(bad(&format!("names the same file as {other:?}")));
        }
    }
    for (rel, (path, _)) in &clean {
        for (slash, _) in rel.match_indices('/') {
            if let Some((file, _)) = clean.get(&rel[..slash]) {
                return Err(AtomicWriteError::InvalidPath {
                    path: (*path).to_owned(),
                    reason: format!("is below {file:?}, a file of the payload"),
                });
            }
        }
    }
    Ok(clean.into_iter().map(|(rel, (_, file))| (rel, file)).collect())
}

/// The first component of a cleaned payload path: the name of its user-visible link.
fn top_level(rel: &str) -> &str {
    rel.split_once('/').map_or(rel, |(first, _)| first)
}

/// Makes `dir` (mode 0755, with its parents) when it is missing.
fn make_target_dir(dir: &Path) -> Result<(), AtomicWriteError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(AtomicWriteError::Unexpected { path: dir.to_path_buf(), what: "is not a directory".into() }),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            std::fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir).map_err(at(dir))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE)).map_err(at(dir))
        }
        Err(e) => Err(at(dir)(e)),
    }
}

/// What `..data` links to.
enum DataLink {
    /// A version directory of the target directory, by name.
    Version(String),
    /// Anything else (a path elsewhere, a missing directory, one of the writer's other names).
    Other(PathBuf),
}

/// Reads the `..data` link of `dir`; `None` when there is none.
fn data_link(dir: &Path) -> Result<Option<DataLink>, AtomicWriteError> {
    let link = dir.join(DATA_DIR);
    let target = match std::fs::read_link(&link) {
        Ok(target) => target,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == ErrorKind::InvalidInput => {
            return Err(AtomicWriteError::Unexpected { path: link, what: "is not a symbolic link".into() });
        }
        Err(e) => return Err(at(&link)(e)),
    };
    let version = target.to_str().filter(|t| is_version_name(t)).map(str::to_owned);
    Ok(Some(match version {
        Some(name) if std::fs::symlink_metadata(dir.join(&name)).is_ok_and(|m| m.is_dir()) => DataLink::Version(name),
        _ => DataLink::Other(target),
    }))
}

/// Whether `name` can be one of the writer's version directories: one component starting with `..`, not one of
/// the writer's links.
fn is_version_name(name: &str) -> bool {
    name.len() > 2 && name.starts_with("..") && !name.contains('/') && name != DATA_DIR && name != DATA_TMP
}

/// Whether `name` has the form of the version directories the writer (and the kubelet) makes: `..` then a digit
/// of the year.
fn is_stamped_name(name: &str) -> bool {
    is_version_name(name) && name.as_bytes().get(2).is_some_and(u8::is_ascii_digit)
}

/// Whether a link's target points into `..data`: the writer's kind of user-visible link.
fn into_data(target: &Path) -> bool {
    target.starts_with(DATA_DIR)
}

/// The regular files below `root` by relative path, each with its path and (not followed) metadata; `None` when
/// something else than directories and regular files is there, or a name that is not UTF-8.
type Found = BTreeMap<String, (PathBuf, std::fs::Metadata)>;

/// Walks `root` without following symbolic links; see [`Found`].
fn files_under(root: &Path) -> Result<Option<Found>, AtomicWriteError> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![(root.to_path_buf(), String::new())];
    while let Some((path, rel)) = dirs.pop() {
        for entry in std::fs::read_dir(&path).map_err(at(&path))? {
            let entry = entry.map_err(at(&path))?;
            let Ok(name) = entry.file_name().into_string() else { return Ok(None) };
            let sub = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            // Not followed: the metadata of a link is the link's.
            let meta = entry.metadata().map_err(at(&entry.path()))?;
            if meta.is_dir() {
                dirs.push((entry.path(), sub));
            } else if meta.is_file() {
                out.insert(sub, (entry.path(), meta));
            } else {
                return Ok(None);
            }
        }
    }
    Ok(Some(out))
}

/// The content (at most `limit` bytes, when given) and permission bits of the regular file `path`, opened
/// without following a link and without blocking on a FIFO.
fn read_regular(path: &Path, limit: Option<u64>) -> std::io::Result<(Vec<u8>, u32)> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let file = std::fs::File::from(rustix::fs::open(path, flags, Mode::empty())?);
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut data = Vec::new();
    match limit {
        Some(limit) => file.take(limit).read_to_end(&mut data)?,
        None => (&file).read_to_end(&mut data)?,
    };
    Ok((data, meta.mode() & 0o7777))
}

/// Whether the version directory `root` holds exactly `files`: the same paths, bytes, permission bits, and owner
/// and group where the payload names them. A
/// version that cannot be read does not hold them (it is replaced).
fn holds_exactly(root: &Path, files: &BTreeMap<String, &FileProjection>) -> bool {
    let found = match files_under(root) {
        Ok(Some(found)) => found,
        Ok(None) => return false,
        Err(e) => {
            tracing::debug!(error = %e, "the current version cannot be read; it is replaced");
            return false;
        }
    };
    if !found.keys().eq(files.keys()) {
        return false;
    }
    found.values().zip(files.values()).all(|((path, meta), want)| {
        let len = u64::try_from(want.data.len()).unwrap_or(u64::MAX);
        meta.mode() & 0o7777 == want.mode & 0o7777
            && want.owner.is_none_or(|u| meta.uid() == u)
            && want.group.is_none_or(|g| meta.gid() == g)
            && meta.len() == len
            && read_regular(path, Some(len.saturating_add(1))).is_ok_and(|(data, _)| data == want.data)
    })
}

/// Makes a new, empty version directory in `dir` (mode 0755) and returns its name: `..`, the UTC time as
/// `2006_01_02_15_04_05.`, then ten digits unique to this call.
fn new_version_dir(dir: &Path) -> Result<String, AtomicWriteError> {
    let stamp = jiff::Timestamp::now().strftime("..%Y_%m_%d_%H_%M_%S.").to_string();
    for _ in 0..64 {
        let name = format!("{stamp}{:010}", unique_suffix());
        let path = dir.join(&name);
        match std::fs::DirBuilder::new().mode(DIR_MODE).create(&path) {
            Ok(()) => {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(DIR_MODE)).map_err(at(&path))?;
                return Ok(name);
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(at(&path)(e)),
        }
    }
    Err(AtomicWriteError::Unexpected { path: dir.to_path_buf(), what: "no unused name for a new version".into() })
}

/// A number below 10^10 that differs from call to call (and from process to process).
fn unique_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    // A `RandomState` is keyed randomly for each process (and differently for each one made).
    let mut h = std::hash::RandomState::new().build_hasher();
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.write_i128(jiff::Timestamp::now().as_nanosecond());
    h.finish() % 10_000_000_000
}

/// Writes `files` into the new, empty version directory `root`: the directories of nested paths with mode 0755
/// (given to `group` as [`own_dir`] gives them), each file created anew (so never through a link) and then given
/// its permission bits exactly, and its owner and group.
fn fill(root: &Path, files: &BTreeMap<String, &FileProjection>, group: Option<u32>) -> Result<(), AtomicWriteError> {
    for (rel, file) in files {
        if let Some((parent, _)) = rel.rsplit_once('/') {
            let mut path = root.to_path_buf();
            for name in parent.split('/') {
                path.push(name);
                match std::fs::DirBuilder::new().mode(DIR_MODE).create(&path) {
                    Ok(()) => {
                        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(DIR_MODE))
                            .map_err(at(&path))?;
                        if let Some(group) = group {
                            own_dir(&path, group)?;
                        }
                    }
                    // Made for an earlier file of the payload (a file there is refused by the validation).
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(at(&path)(e)),
                }
            }
        }
        let path = root.join(rel);
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).map_err(at(&path))?;
        f.write_all(&file.data).map_err(at(&path))?;
        f.set_permissions(std::fs::Permissions::from_mode(file.mode & 0o7777)).map_err(at(&path))?;
        if file.owner.is_some() || file.group.is_some() {
            // A file for a user must be theirs; a group the file system refuses is logged, as the kubelet's
            // ownership change logs it, and the file is readable as its mode says.
            match std::os::unix::fs::fchown(&f, file.owner, file.group) {
                Ok(()) => {}
                Err(e) if file.owner.is_some() => return Err(at(&path)(e)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot give the file to the pod's fsGroup")
                }
            }
        }
    }
    Ok(())
}

/// Gives directory `path` to `group`, readable and searchable by it, and set-group-ID (so that what is made in it
/// is the group's too), as the kubelet's ownership change of a volume does; a change the file system refuses is
/// logged, as the kubelet logs it.
fn own_dir(path: &Path, group: u32) -> Result<(), AtomicWriteError> {
    let meta = std::fs::symlink_metadata(path).map_err(at(path))?;
    let mode = meta.mode() & 0o7777 | 0o2550;
    let changed = if meta.gid() == group { Ok(()) } else { std::os::unix::fs::lchown(path, None, Some(group)) }
        .and_then(|()| {
            if meta.mode() & 0o7777 == mode {
                return Ok(());
            }
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        });
    if let Err(e) = changed {
        tracing::warn!(path = %path.display(), error = %e, "cannot give the directory to the pod's fsGroup");
    }
    Ok(())
}

/// Checks (`apply` false) or makes (`apply` true) the user-visible link `<name> -> ..data/<name>` of each of
/// `names`: a missing link is made, a link into `..data` to another path is replaced, anything else is refused
/// and kept. Returns whether a link is (or was) to be made or replaced.
fn visible_links(dir: &Path, names: &BTreeSet<&str>, apply: bool) -> Result<bool, AtomicWriteError> {
    let mut changed = false;
    for name in names {
        let link = dir.join(name);
        let want = Path::new(DATA_DIR).join(name);
        let occupied = || AtomicWriteError::Occupied { path: link.clone(), name: (*name).to_owned() };
        match std::fs::symlink_metadata(&link) {
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(at(&link)(e)),
            Ok(m) if !m.file_type().is_symlink() => return Err(occupied()),
            Ok(_) => {
                let target = std::fs::read_link(&link).map_err(at(&link))?;
                if target == want {
                    continue;
                }
                if !into_data(&target) {
                    return Err(occupied());
                }
                if apply {
                    std::fs::remove_file(&link).map_err(at(&link))?;
                }
            }
        }
        changed = true;
        if apply {
            std::os::unix::fs::symlink(&want, &link).map_err(at(&link))?;
        }
    }
    Ok(changed)
}

/// Points `..data` to the version directory `version` in one rename of a new `..data_tmp` link (one left by an
/// interrupted write is replaced).
fn switch_data(dir: &Path, version: &str) -> Result<(), AtomicWriteError> {
    let tmp = dir.join(DATA_TMP);
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(at(&tmp)(e)),
    }
    std::os::unix::fs::symlink(version, &tmp).map_err(at(&tmp))?;
    let data = dir.join(DATA_DIR);
    std::fs::rename(&tmp, &data).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        at(&data)(e)
    })
}

/// Brings the links of `dir` in line with the version `current`: the links of `names` made, the writer's links of
/// other names removed (a link into `..data`; nothing else is touched), and the version directories that an
/// interrupted write left (every stamped one but `current`) removed. Returns whether a link was made or removed.
fn tidy(dir: &Path, names: &BTreeSet<&str>, current: &str) -> Result<bool, AtomicWriteError> {
    let mut changed = visible_links(dir, names, true)?;
    for entry in std::fs::read_dir(dir).map_err(at(dir))? {
        let entry = entry.map_err(at(dir))?;
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else { continue };
        let path = entry.path();
        let kind = entry.file_type().map_err(at(&path))?;
        if name.starts_with("..") {
            if kind.is_dir() && name != current && is_stamped_name(name) {
                // Left by an interrupted write; failing to remove it does not fail the write.
                if let Err(e) = std::fs::remove_dir_all(&path) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove an old version");
                }
            }
        } else if kind.is_symlink()
            && !names.contains(name)
            && std::fs::read_link(&path).is_ok_and(|target| into_data(&target))
        {
            match std::fs::remove_file(&path) {
                Ok(()) => changed = true,
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(at(&path)(e)),
            }
        }
    }
    Ok(changed)
}

/// Removes what a failed write made, as far as it can: the failure reported is the write's.
fn remove_quietly(path: &Path) {
    if let Err(e) = std::fs::remove_dir_all(path) {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove an unfinished version");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(data: &str, mode: u32) -> FileProjection {
        FileProjection::new(data.as_bytes().to_vec(), mode)
    }

    #[test]
    fn an_owned_payload_gives_its_files_and_directories_to_their_owner_and_group() {
        if !rustix::process::getuid().is_root() {
            eprintln!("skipped: needs root to give files away");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("v");
        let owned = |data: &str| FileProjection { owner: Some(1234), group: Some(4321), ..file(data, 0o640) };
        let payload: BTreeMap<String, FileProjection> =
            [("token".to_owned(), owned("t")), ("sub/ca.crt".to_owned(), owned("pem"))].into();
        assert!(write(&dir, &payload).unwrap());
        let meta = |p: &Path| std::fs::symlink_metadata(p).unwrap();
        for f in ["token", "sub/ca.crt"] {
            let m = meta(&dir.join(DATA_DIR).join(f).canonicalize().unwrap());
            assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (1234, 4321, 0o640), "{f}");
        }
        let version = dir.join(DATA_DIR).canonicalize().unwrap();
        for d in [dir.clone(), version.clone(), version.join("sub")] {
            let m = meta(&d);
            assert_eq!((m.gid(), m.mode() & 0o7777), (4321, 0o2755), "{}", d.display());
        }
        assert!(!write(&dir, &payload).unwrap(), "the same payload, owned as it is: nothing written");
        std::os::unix::fs::lchown(version.join("token"), None, Some(0)).unwrap();
        assert!(write(&dir, &payload).unwrap(), "a file no longer the group's is written again");
        assert_eq!(meta(&dir.join(DATA_DIR).join("token").canonicalize().unwrap()).gid(), 4321);
    }

    fn payload(files: &[(&str, &str, u32)]) -> BTreeMap<String, FileProjection> {
        files.iter().map(|(path, data, mode)| ((*path).to_owned(), file(data, *mode))).collect()
    }

    fn version(dir: &Path) -> String {
        std::fs::read_link(dir.join(DATA_DIR)).unwrap().to_str().unwrap().to_owned()
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    /// The entries of `dir` by name, each with its link target when it is a link.
    fn entries(dir: &Path) -> BTreeMap<String, Option<PathBuf>> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name().into_string().unwrap(), std::fs::read_link(e.path()).ok())
            })
            .collect()
    }

    fn stamped(dir: &Path) -> Vec<String> {
        entries(dir).into_keys().filter(|n| is_stamped_name(n)).collect()
    }

    #[test]
    fn first_write_lays_out_a_version_its_data_link_and_visible_links() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pods/u/volumes/cm");
        let files = payload(&[
            ("secret", "s3cr3t", 0o400),
            ("config", "a=1\n", 0o644),
            ("open", "x", 0o666),
            ("a/b/c", "nested", 0o100_640),
        ]);
        assert!(write(&dir, &files).unwrap());

        assert_eq!(mode(&dir), 0o755, "the volume directory is made");
        let v = version(&dir);
        assert!(is_stamped_name(&v), "{v}");
        // `..` + 2006_01_02_15_04_05 + `.` + ten digits.
        assert_eq!(v.len(), 2 + 19 + 1 + 10, "{v}");
        assert_eq!(&v[6..7], "_");
        assert_eq!(&v[21..22], ".");
        assert!(v[22..].bytes().all(|b| b.is_ascii_digit()), "{v}");
        let root = dir.join(&v);
        assert_eq!(mode(&root), 0o755);
        assert_eq!(mode(&root.join("a")), 0o755);
        assert_eq!(mode(&root.join("a/b")), 0o755);
        assert_eq!(mode(&root.join("secret")), 0o400);
        assert_eq!(mode(&root.join("config")), 0o644);
        assert_eq!(mode(&root.join("open")), 0o666, "the umask does not apply");
        assert_eq!(mode(&root.join("a/b/c")), 0o640, "only the permission bits are taken");

        let want: BTreeMap<String, Option<PathBuf>> = [
            ("..data", Some(PathBuf::from(&v))),
            (&v, None),
            ("secret", Some(PathBuf::from("..data/secret"))),
            ("config", Some(PathBuf::from("..data/config"))),
            ("open", Some(PathBuf::from("..data/open"))),
            ("a", Some(PathBuf::from("..data/a"))),
        ]
        .into_iter()
        .map(|(n, t)| (n.to_owned(), t))
        .collect();
        assert_eq!(entries(&dir), want, "one link per top-level name, no ..data_tmp left");

        assert_eq!(std::fs::read_to_string(dir.join("secret")).unwrap(), "s3cr3t");
        assert_eq!(std::fs::read_to_string(dir.join("a/b/c")).unwrap(), "nested");
        let read = current(&dir).unwrap().unwrap();
        assert_eq!(read.keys().collect::<Vec<_>>(), ["a/b/c", "config", "open", "secret"]);
        assert_eq!(read["a/b/c"], file("nested", 0o640));
        assert_eq!(read["secret"], file("s3cr3t", 0o400));
    }

    #[test]
    fn an_unchanged_payload_is_not_written_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let files = payload(&[("k", "v", 0o644), ("d/e", "f", 0o400)]);
        assert_eq!(current(dir).unwrap(), None);
        assert!(write(dir, &files).unwrap());
        let v = version(dir);
        let before = entries(dir);
        assert!(!write(dir, &files).unwrap());
        assert_eq!(version(dir), v, "the same version stays");
        assert_eq!(entries(dir), before);

        // Paths as the kubelet cleans them, and modes compared on their permission bits.
        let same = payload(&[("./k", "v", 0o100_644), ("d//e", "f", 0o400)]);
        assert!(!write(dir, &same).unwrap());
        assert_eq!(version(dir), v);

        // A change of mode alone is a change.
        let chmod = payload(&[("k", "v", 0o600), ("d/e", "f", 0o400)]);
        assert!(write(dir, &chmod).unwrap());
        assert_ne!(version(dir), v);
        assert_eq!(current(dir).unwrap().unwrap()["k"], file("v", 0o600));
        // So is a change of content of the same length.
        let v = version(dir);
        assert!(write(dir, &payload(&[("k", "w", 0o600), ("d/e", "f", 0o400)])).unwrap());
        assert_ne!(version(dir), v);
        assert_eq!(std::fs::read_to_string(dir.join("k")).unwrap(), "w");
    }

    #[test]
    fn a_changed_payload_switches_versions() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("user.txt"), "not the writer's").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join("elsewhere")).unwrap();
        let v1 = payload(&[("changed", "old", 0o644), ("removed", "r", 0o644), ("dir/f", "d", 0o644)]);
        assert!(write(dir, &v1).unwrap());
        let old = version(dir);
        let mut held = std::fs::File::open(dir.join("changed")).unwrap();

        let v2 = payload(&[("changed", "new", 0o644), ("dir/g", "g", 0o600), ("added", "a", 0o400)]);
        assert!(write(dir, &v2).unwrap());
        let new = version(dir);
        assert_ne!(new, old);
        assert!(!dir.join(&old).exists(), "the old version is removed");
        assert_eq!(stamped(dir), [new.as_str()]);
        assert!(std::fs::symlink_metadata(dir.join("removed")).is_err(), "the link of a removed name is removed");
        assert_eq!(std::fs::read_to_string(dir.join("changed")).unwrap(), "new");
        assert_eq!(std::fs::read_to_string(dir.join("added")).unwrap(), "a");
        assert!(!dir.join("dir/f").exists());
        assert_eq!(std::fs::read_to_string(dir.join("dir/g")).unwrap(), "g");
        let read = current(dir).unwrap().unwrap();
        assert_eq!(read, v2.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<BTreeMap<_, _>>());
        // What is not the writer's stays.
        assert_eq!(std::fs::read_to_string(dir.join("user.txt")).unwrap(), "not the writer's");
        assert_eq!(std::fs::read_link(dir.join("elsewhere")).unwrap(), Path::new("/etc/hostname"));
        assert!(!dir.join(DATA_TMP).exists());

        // A reader holding a file of the old version still reads the old content.
        let mut s = String::new();
        held.read_to_string(&mut s).unwrap();
        assert_eq!(s, "old");

        // An empty payload empties the volume.
        assert!(write(dir, &BTreeMap::new()).unwrap());
        assert_eq!(current(dir).unwrap(), Some(BTreeMap::new()));
        let left: Vec<String> = entries(dir).into_keys().filter(|n| !n.starts_with("..")).collect();
        assert_eq!(left, ["elsewhere", "user.txt"]);
    }

    #[test]
    fn invalid_paths_are_refused_and_nothing_is_written() {
        let long_name = "n".repeat(256);
        let long_path = vec!["p"; 2049].join("/");
        let cases = [
            ("../x", "'..' component"),
            ("/abs", "relative"),
            ("..data", "start with '..'"),
            ("..x/y", "start with '..'"),
            ("..", "'..' component"),
            ("a/../b", "'..' component"),
            ("", "empty"),
            ("./", "must name a file"),
            ("a\0b", "NUL"),
            (long_name.as_str(), "255"),
            (long_path.as_str(), "4096"),
        ];
        let tmp = tempfile::tempdir().unwrap();
        let fresh = tmp.path().join("fresh");
        let dir = tmp.path().join("vol");
        let v1 = payload(&[("ok", "1", 0o644)]);
        assert!(write(&dir, &v1).unwrap());
        let before = entries(&dir);
        for (bad, reason) in cases {
            let mut files = payload(&[("ok", "2", 0o644), ("zz", "z", 0o644)]);
            files.insert(bad.to_owned(), file("bad", 0o644));
            for target in [&fresh, &dir] {
                match write(target, &files) {
                    Err(AtomicWriteError::InvalidPath { path, reason: why }) => {
                        assert_eq!(path, bad);
                        assert!(why.contains(reason), "{bad:?}: {why}");
                    }
                    other => panic!("{bad:?}: {other:?}"),
                }
            }
            assert!(!fresh.exists(), "{bad:?}: nothing is made for an invalid payload");
            assert_eq!(entries(&dir), before, "{bad:?}");
            assert_eq!(std::fs::read_to_string(dir.join("ok")).unwrap(), "1");
        }
        // Two paths naming one file, or a file below another, are refused too.
        let same = payload(&[("k", "1", 0o644), ("./k", "2", 0o644)]);
        assert!(matches!(write(&dir, &same), Err(AtomicWriteError::InvalidPath { .. })));
        let below = payload(&[("a", "1", 0o644), ("a/b", "2", 0o644)]);
        let err = write(&dir, &below).unwrap_err().to_string();
        assert!(err.contains("\"a/b\"") && err.contains("below \"a\""), "{err}");
        assert_eq!(entries(&dir), before);
        // A name inside that starts with `..` is not reserved; 255 bytes and 4096 bytes are allowed.
        let edge = payload(&[("a/..b", "1", 0o644), (&"n".repeat(255), "2", 0o644)]);
        assert!(write(&dir, &edge).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a/..b")).unwrap(), "1");
        let path_4096 = format!("{}/qq", vec!["p"; 2047].join("/"));
        assert_eq!(path_4096.len(), 4096);
        assert!(validate(&payload(&[(&path_4096, "3", 0o644)])).is_ok());
        // (Written, a path that long would pass the kernel's limit once joined to the directory: a deep one is.)
        let deep = vec!["p"; 500].join("/");
        assert!(write(&dir, &payload(&[(&deep, "3", 0o644)])).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join(&deep)).unwrap(), "3");
    }

    #[test]
    fn a_stale_data_tmp_is_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::os::unix::fs::symlink("..2020_01_01_00_00_00.1", dir.join(DATA_TMP)).unwrap();
        assert!(write(dir, &payload(&[("k", "1", 0o644)])).unwrap());
        assert!(std::fs::symlink_metadata(dir.join(DATA_TMP)).is_err());
        assert_eq!(std::fs::read_to_string(dir.join("k")).unwrap(), "1");

        // Left by a crash between its making and the rename: the next write replaces it.
        std::os::unix::fs::symlink(version(dir), dir.join(DATA_TMP)).unwrap();
        assert!(write(dir, &payload(&[("k", "2", 0o644)])).unwrap());
        assert!(std::fs::symlink_metadata(dir.join(DATA_TMP)).is_err());
        assert_eq!(std::fs::read_to_string(dir.join("k")).unwrap(), "2");

        std::fs::write(dir.join(DATA_TMP), "junk").unwrap();
        assert!(write(dir, &payload(&[("k", "3", 0o644)])).unwrap());
        assert!(std::fs::symlink_metadata(dir.join(DATA_TMP)).is_err());
        assert_eq!(std::fs::read_to_string(dir.join("k")).unwrap(), "3");
    }

    #[test]
    fn what_is_not_the_writers_at_a_visible_name_is_refused_and_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("file"), "mine").unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/inner"), "mine too").unwrap();
        std::os::unix::fs::symlink("/etc", dir.join("link")).unwrap();
        for taken in ["file", "sub", "link"] {
            let files = payload(&[("free", "1", 0o644), (&format!("{taken}/x"), "2", 0o644)]);
            match write(dir, &files) {
                Err(AtomicWriteError::Occupied { path, name }) => {
                    assert_eq!(name, taken);
                    assert_eq!(path, dir.join(taken));
                }
                other => panic!("{taken}: {other:?}"),
            }
            assert!(std::fs::symlink_metadata(dir.join(DATA_DIR)).is_err(), "{taken}: nothing is written");
            assert!(std::fs::symlink_metadata(dir.join("free")).is_err(), "{taken}: nothing is written");
            assert!(stamped(dir).is_empty(), "{taken}");
        }
        assert_eq!(std::fs::read_to_string(dir.join("file")).unwrap(), "mine");
        assert_eq!(std::fs::read_to_string(dir.join("sub/inner")).unwrap(), "mine too");
        assert_eq!(std::fs::read_link(dir.join("link")).unwrap(), Path::new("/etc"));

        // Once a version exists, the same holds: the version stays.
        assert!(write(dir, &payload(&[("free", "1", 0o644)])).unwrap());
        let v = version(dir);
        let err = write(dir, &payload(&[("free", "2", 0o644), ("file", "x", 0o644)])).unwrap_err();
        assert!(err.to_string().contains("not a link into ..data"), "{err}");
        assert_eq!(version(dir), v);
        assert_eq!(std::fs::read_to_string(dir.join("free")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(dir.join("file")).unwrap(), "mine");
    }

    #[test]
    fn what_an_interrupted_write_left_is_repaired() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let files = payload(&[("a", "1", 0o644), ("b/c", "2", 0o644)]);
        assert!(write(dir, &files).unwrap());
        let v = version(dir);
        // A crash after the switch, before the links: a link missing, a removed name's link left, an old version
        // left (and one from before the switch, never used).
        std::fs::remove_file(dir.join("a")).unwrap();
        std::os::unix::fs::symlink("..data/gone", dir.join("gone")).unwrap();
        std::fs::remove_file(dir.join("b")).unwrap();
        std::os::unix::fs::symlink("..data/elsewhere", dir.join("b")).unwrap();
        for orphan in ["..2020_01_01_00_00_00.0000000001", "..2020_01_01_00_00_00.0000000002"] {
            std::fs::create_dir(dir.join(orphan)).unwrap();
            std::fs::write(dir.join(orphan).join("a"), "old").unwrap();
        }
        std::fs::create_dir(dir.join("..keep")).unwrap();

        assert!(write(dir, &files).unwrap(), "links were repaired");
        assert_eq!(version(dir), v, "no new version for an unchanged payload");
        assert_eq!(std::fs::read_link(dir.join("a")).unwrap(), Path::new("..data/a"));
        assert_eq!(std::fs::read_link(dir.join("b")).unwrap(), Path::new("..data/b"));
        assert!(std::fs::symlink_metadata(dir.join("gone")).is_err());
        assert_eq!(stamped(dir), [v]);
        assert!(dir.join("..keep").is_dir(), "only stamped versions are removed");
        assert!(!write(dir, &files).unwrap());
    }

    #[test]
    fn a_data_link_out_of_the_directory_is_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("k"), "v").unwrap();
        let dir = tmp.path().join("vol");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join(DATA_DIR)).unwrap();
        assert!(matches!(current(&dir), Err(AtomicWriteError::Unexpected { .. })));
        // Even with the same content there: it is not a version of this directory.
        assert!(write(&dir, &payload(&[("k", "v", 0o644)])).unwrap());
        assert!(is_stamped_name(&version(&dir)));
        assert_eq!(std::fs::read_to_string(outside.join("k")).unwrap(), "v", "the target is left alone");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);

        // A `..data` that is a directory is not the writer's: refused.
        let other = tmp.path().join("other");
        std::fs::create_dir_all(other.join(DATA_DIR)).unwrap();
        assert!(matches!(write(&other, &payload(&[("k", "v", 0o644)])), Err(AtomicWriteError::Unexpected { .. })));
        assert!(other.join(DATA_DIR).is_dir());
    }

    #[test]
    fn debug_shows_no_content() {
        let f = file("hunter2-secret", 0o400);
        let shown = format!("{f:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("104"), "{shown}");
        assert_eq!(shown, "FileProjection { len: 14, mode: 0o400 }");
    }
}
