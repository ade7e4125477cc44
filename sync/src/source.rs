//! Pod sources. A source sends the whole set of pods it has whenever that set may have changed; the pod manager
//! works out what was added, changed and removed. The static pod directory is the first source; an apiserver
//! source implements the same trait.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use inotify::{EventMask, Inotify, WatchMask};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::manifest::{ManifestError, parse_static_pod, read_manifest};

/// A manifest that was refused, with why.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidManifest {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub error: ManifestError,
}

/// Everything one source has now.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSnapshot {
    /// The source's name (`file`, `api`).
    pub source: &'static str,
    /// The valid pods, each with its UID set. Shared: a source hands over the same `Arc` for a pod that has not
    /// changed since its last snapshot, and the pod manager passes over it without comparing it field by field
    /// (a hundred pods and a snapshot on every change would otherwise cost a hundred deep comparisons each).
    pub pods: Vec<Arc<Pod>>,
    /// What was refused.
    pub invalid: Vec<InvalidManifest>,
}

/// The static pod directory's name as a source.
pub const FILE_SOURCE: &str = "file";

/// The apiserver's name as a source (the `kubernetes.io/config.source` of its pods).
pub const API_SOURCE: &str = "api";

/// Whether a pod came from the apiserver (not a static pod, from a manifest or a URL).
pub fn from_apiserver(pod: &Pod) -> bool {
    let source = pod.metadata.annotations.as_ref().and_then(|a| a.get(crate::CONFIG_SOURCE_ANNOTATION));
    source.map(String::as_str) == Some(API_SOURCE)
}

/// A source of pods: runs until shutdown, sending a snapshot after each change.
pub trait PodSource: Send + 'static {
    /// Runs the source. The first snapshot is the initial state; the manager treats pods it adopted and that no
    /// first snapshot names as gone.
    fn run(self, tx: mpsc::Sender<SourceSnapshot>, shutdown: CancellationToken) -> impl Future<Output = ()> + Send;
}

/// True for files in the manifest directory that are not manifests: hidden files (as the kubelet skips them),
/// and the backup, swap and temporary files editors and package managers leave beside the files they edit.
pub fn is_ignored_file(name: &str) -> bool {
    const SUFFIXES: [&str; 9] = ["~", ".swp", ".swo", ".swx", ".tmp", ".bak", ".orig", ".rpmnew", ".dpkg-new"];
    name.starts_with('.')
        || name.starts_with('#')
        || SUFFIXES.iter().any(|s| name.ends_with(s))
        || name.contains(".dpkg-")
        // vim creates and removes a file named 4913 to test whether it may write the directory.
        || name == "4913"
}

/// A file's identity and version, so unchanged files are not parsed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct FileKey {
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

/// How soon a scan that met a transient error (an unreadable directory, entry or file) is retried.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The static pod directory (`staticPodPath`), watched with inotify and rescanned every `fileCheckFrequency`.
#[derive(Debug)]
pub struct StaticPodSource {
    dir: PathBuf,
    node_name: String,
    resync: Duration,
    cache: HashMap<PathBuf, (FileKey, Result<Arc<Pod>, ManifestError>)>,
    /// The last scan met a transient error: the next one comes after [`RETRY_AFTER`].
    retry: bool,
}

/// The identity of a file in the directory: `Ok(None)` when it is not a regular file or vanished meanwhile.
fn file_key(path: &Path) -> std::io::Result<Option<FileKey>> {
    use std::os::unix::fs::MetadataExt;
    // Follow symlinks, as a file read would.
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => {
            Ok(Some(FileKey { ino: meta.ino(), len: meta.len(), mtime: meta.mtime(), mtime_nsec: meta.mtime_nsec() }))
        }
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl StaticPodSource {
    /// A source for `dir` on node `node_name`, rescanned every `resync` besides the inotify events.
    pub fn new(dir: impl Into<PathBuf>, node_name: impl Into<String>, resync: Duration) -> Self {
        Self { dir: dir.into(), node_name: node_name.into(), resync, cache: HashMap::new(), retry: false }
    }

    /// The directory's files with their keys; `None` when it cannot be listed (a missing directory has no files).
    /// A file whose metadata cannot be read keeps the key it was last parsed with, so it keeps its pod.
    fn list(&mut self) -> Option<Vec<(PathBuf, FileKey)>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(Vec::new()),
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot list the static pod directory; keeping its pods and retrying");
                return None;
            }
        };
        let mut files = Vec::new();
        for e in entries {
            let e = match e {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "cannot list the static pod directory; keeping its pods and retrying");
                    return None;
                }
            };
            if is_ignored_file(&e.file_name().to_string_lossy()) {
                continue;
            }
            let path = e.path();
            match file_key(&path) {
                Ok(Some(key)) => files.push((path, key)),
                Ok(None) => {}
                Err(err) => {
                    self.retry = true;
                    tracing::warn!(manifest = %path.display(), error = %err, "cannot stat a static pod manifest; keeping its pod and retrying");
                    if let Some((key, _)) = self.cache.get(&path) {
                        files.push((path, *key));
                    }
                }
            }
        }
        files.sort();
        Some(files)
    }

    /// Parses a manifest, or takes it from the cache when unchanged. A file that cannot be read is not cached
    /// (it is read again on the next scan) and keeps the pod it last gave, if any.
    fn parse(&mut self, path: &Path, key: FileKey) -> Result<Arc<Pod>, ManifestError> {
        if let Some((k, parsed)) = self.cache.get(path)
            && *k == key
        {
            return parsed.clone();
        }
        let parsed = read_manifest(path).and_then(|b| parse_static_pod(&b, path, &self.node_name)).map(Arc::new);
        match &parsed {
            Err(e @ ManifestError::Read(_)) => {
                self.retry = true;
                tracing::warn!(manifest = %path.display(), error = %e, "cannot read a static pod manifest; retrying");
                if let Some((_, Ok(pod))) = self.cache.get(path) {
                    return Ok(pod.clone());
                }
                return parsed;
            }
            Err(e) => tracing::warn!(manifest = %path.display(), error = %e, "invalid static pod manifest"),
            Ok(_) => {}
        }
        self.cache.insert(path.to_path_buf(), (key, parsed.clone()));
        parsed
    }

    /// Reads the directory: each manifest file parsed (or taken from the cache when unchanged), pods with the
    /// same namespace and name in two files refused after the first. `None` when the directory cannot be
    /// listed: an unreadable directory never means "no pods", so the caller keeps what it had.
    pub fn scan(&mut self) -> Option<SourceSnapshot> {
        self.retry = false;
        let Some(files) = self.list() else {
            self.retry = true;
            return None;
        };
        let present: HashSet<&PathBuf> = files.iter().map(|(f, _)| f).collect();
        self.cache.retain(|p, _| present.contains(p));
        let mut pods = Vec::new();
        let mut invalid = Vec::new();
        let mut names: BTreeMap<(String, String), PathBuf> = BTreeMap::new();
        let mut uids: BTreeMap<String, PathBuf> = BTreeMap::new();
        for (path, key) in files {
            match self.parse(&path, key) {
                Ok(pod) => {
                    let full = (
                        pod.metadata.namespace.clone().unwrap_or_default(),
                        pod.metadata.name.clone().unwrap_or_default(),
                    );
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    if let Some(first) = names.get(&full) {
                        let error = ManifestError::Invalid {
                            field: "metadata.name".into(),
                            message: format!("pod {}/{} is already defined in {}", full.0, full.1, first.display()),
                        };
                        invalid.push(InvalidManifest { path, error });
                    } else if let Some(first) = uids.get(&uid) {
                        // Two pods with one UID would share a cgroup, a state file and volumes.
                        let error = ManifestError::Invalid {
                            field: "metadata.uid".into(),
                            message: format!("uid {uid} is already used by {}", first.display()),
                        };
                        invalid.push(InvalidManifest { path, error });
                    } else {
                        uids.insert(uid, path.clone());
                        names.insert(full, path);
                        pods.push(pod);
                    }
                }
                Err(error) => invalid.push(InvalidManifest { path, error }),
            }
        }
        Some(SourceSnapshot { source: FILE_SOURCE, pods, invalid })
    }

    fn watch(&self) -> Option<inotify::EventStream<Vec<u8>>> {
        let inotify = match Inotify::init() {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(error = %e, "cannot use inotify; the static pod directory is only rescanned");
                return None;
            }
        };
        let mask = WatchMask::CLOSE_WRITE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::DELETE
            | WatchMask::CREATE
            | WatchMask::ATTRIB
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF;
        if let Err(e) = inotify.watches().add(&self.dir, mask) {
            if self.dir.exists() {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot watch the static pod directory");
            }
            return None;
        }
        inotify.into_event_stream(vec![0u8; 16 * 1024]).ok()
    }
}

/// Whether an inotify event calls for a rescan; `None` when the watch itself is gone.
fn wants_rescan(mask: EventMask, name: Option<&std::ffi::OsStr>) -> Option<bool> {
    if mask.intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED) {
        return None;
    }
    if mask.contains(EventMask::Q_OVERFLOW) {
        return Some(true);
    }
    Some(name.is_none_or(|n| !is_ignored_file(&n.to_string_lossy())))
}

impl PodSource for StaticPodSource {
    async fn run(mut self, tx: mpsc::Sender<SourceSnapshot>, shutdown: CancellationToken) {
        let mut events = self.watch();
        if events.is_none() && !self.dir.exists() {
            tracing::warn!(dir = %self.dir.display(), "the static pod directory does not exist; checking again every {:?}", self.resync);
        }
        let mut last: Option<SourceSnapshot> = None;
        loop {
            // Events that are already queued (a burst of renames, or those that came during the last scan) are
            // taken by this one scan, instead of one scan and one snapshot each.
            while let Some(ev) = next_event(&mut events).now_or_never() {
                if ev.is_none() {
                    events = self.watch();
                    break;
                }
            }
            // A scan that could not list the directory sends nothing: the pods stay as they were.
            if let Some(snapshot) = self.scan()
                && last.as_ref() != Some(&snapshot)
            {
                if tx.send(snapshot.clone()).await.is_err() {
                    return;
                }
                last = Some(snapshot);
            }
            let resync = tokio::time::sleep(if self.retry { RETRY_AFTER.min(self.resync) } else { self.resync });
            tokio::pin!(resync);
            loop {
                tokio::select! {
                    () = &mut resync => {
                        if events.is_none() {
                            events = self.watch();
                        }
                        break;
                    }
                    () = shutdown.cancelled() => return,
                    ev = next_event(&mut events) => match ev {
                        Some(true) => break,
                        Some(false) => {}
                        None => {
                            // The directory was removed or replaced: watch it again (if it is there) and rescan.
                            events = self.watch();
                            break;
                        }
                    },
                }
            }
        }
    }
}

/// The next inotify event's verdict; pending forever without a watch.
async fn next_event(events: &mut Option<inotify::EventStream<Vec<u8>>>) -> Option<bool> {
    let Some(stream) = events.as_mut() else { return std::future::pending().await };
    match stream.next().await {
        Some(Ok(ev)) => wants_rescan(ev.mask, ev.name.as_deref()),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "inotify read failed; watching again");
            None
        }
        None => None,
    }
}

/// Where a manifest file lives, for messages: its name in the directory.
pub fn manifest_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: NAME}\nspec: {containers: [{name: a, image: b}]}\n";

    #[test]
    fn ignores_editor_files() {
        for f in [".web.yaml.swp", "web.yaml~", "#web.yaml#", ".#web.yaml", "4913", "web.yaml.dpkg-old", "x.tmp"] {
            assert!(is_ignored_file(f), "{f}");
        }
        for f in ["web.yaml", "web.json", "web"] {
            assert!(!is_ignored_file(f), "{f}");
        }
    }

    #[test]
    fn scans_and_reports_invalid_files_beside_valid_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        std::fs::write(dir.path().join("b.yaml"), "kind: Deployment\n").unwrap();
        std::fs::write(dir.path().join("c.yaml"), POD.replace("NAME", "a")).unwrap();
        std::fs::write(dir.path().join(".a.yaml.swp"), "garbage").unwrap();
        // Two manifests naming one UID explicitly: the second is refused.
        let with_uid = |n: &str| {
            POD.replace("NAME", n).replace("metadata: {", "metadata: {uid: 11111111-2222-3333-4444-555555555555, ")
        };
        std::fs::write(dir.path().join("d.yaml"), with_uid("d")).unwrap();
        std::fs::write(dir.path().join("e.yaml"), with_uid("e")).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut src = StaticPodSource::new(dir.path(), "n", Duration::from_secs(20));
        let s = src.scan().unwrap();
        assert_eq!(s.pods.len(), 2);
        assert_eq!(s.pods[0].metadata.name.as_deref(), Some("a-n"));
        assert_eq!(s.invalid.len(), 3);
        assert!(s.invalid[0].error.to_string().contains("not a Pod"));
        assert!(s.invalid[1].error.to_string().contains("already defined in"), "{}", s.invalid[1].error);
        assert!(s.invalid[2].error.to_string().contains("is already used by"), "{}", s.invalid[2].error);
        // Unchanged files give the same snapshot; removing one drops it.
        assert_eq!(src.scan(), Some(s));
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        let s = src.scan().unwrap();
        assert_eq!(s.pods.len(), 2, "c.yaml's pod is no longer a duplicate");
        assert_eq!(s.invalid.len(), 2);
    }

    #[test]
    fn a_directory_that_cannot_be_listed_keeps_its_pods() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("manifests");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        let mut src = StaticPodSource::new(&dir, "n", Duration::from_secs(20));
        assert_eq!(src.scan().unwrap().pods.len(), 1);
        // ENOTDIR stands for EMFILE, EIO or EACCES (root reads through permissions): no snapshot, a retry soon.
        std::fs::rename(&dir, top.path().join("moved")).unwrap();
        std::fs::write(&dir, "not a directory").unwrap();
        assert_eq!(src.scan(), None);
        assert!(src.retry);
        // A missing directory is no error: it has no manifests.
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(src.scan().unwrap().pods.len(), 0);
        assert!(!src.retry);
    }

    #[test]
    fn a_manifest_that_cannot_be_read_keeps_its_pod_and_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.yaml");
        std::fs::write(&a, POD.replace("NAME", "a")).unwrap();
        let mut src = StaticPodSource::new(dir.path(), "n", Duration::from_secs(20));
        let good = src.scan().unwrap();
        // Reading /proc/self/mem at offset 0 fails with EIO: the pod stays, nothing is cached, a retry is due.
        std::fs::remove_file(&a).unwrap();
        std::os::unix::fs::symlink("/proc/self/mem", &a).unwrap();
        assert_eq!(src.scan().as_ref(), Some(&good));
        assert!(src.retry);
        // A manifest whose metadata cannot be read (a symlink loop: ELOOP) keeps its pod too.
        std::fs::remove_file(&a).unwrap();
        std::os::unix::fs::symlink(&a, &a).unwrap();
        assert_eq!(src.scan().as_ref(), Some(&good));
        assert!(src.retry);
        // Readable again: read at once, not taken from a cached error.
        std::fs::remove_file(&a).unwrap();
        std::fs::write(&a, POD.replace("NAME", "b")).unwrap();
        let s = src.scan().unwrap();
        assert_eq!(s.pods[0].metadata.name.as_deref(), Some("b-n"));
        assert!(!src.retry);
        // A file never read well has no pod to keep: it is reported, not cached.
        let c = dir.path().join("c.yaml");
        std::os::unix::fs::symlink("/proc/self/mem", &c).unwrap();
        let s = src.scan().unwrap();
        assert_eq!(s.invalid.len(), 1);
        assert!(!src.cache.contains_key(&c));
    }

    #[tokio::test]
    async fn inotify_reports_writes_renames_and_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let src = StaticPodSource::new(dir.path(), "n", Duration::from_secs(3600));
        let (tx, mut rx) = mpsc::channel(4);
        tokio::spawn(src.run(tx, CancellationToken::new()));
        async fn recv(rx: &mut mpsc::Receiver<SourceSnapshot>) -> SourceSnapshot {
            tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("no snapshot within 5 s").unwrap()
        }
        assert!(recv(&mut rx).await.pods.is_empty());
        // An editor's swap file does not cause a snapshot; a write does.
        std::fs::write(dir.path().join(".w.yaml.swp"), "x").unwrap();
        std::fs::write(dir.path().join("w.yaml"), POD.replace("NAME", "w")).unwrap();
        assert_eq!(recv(&mut rx).await.pods.len(), 1);
        // Replace by rename, as editors and config management do: a new UID.
        let tmp = dir.path().join(".w.yaml.new");
        std::fs::write(&tmp, POD.replace("NAME", "w").replace("image: b", "image: c")).unwrap();
        std::fs::rename(&tmp, dir.path().join("w.yaml")).unwrap();
        assert_eq!(recv(&mut rx).await.pods[0].spec.as_ref().unwrap().containers[0].image.as_deref(), Some("c"));
        std::fs::remove_file(dir.path().join("w.yaml")).unwrap();
        assert!(recv(&mut rx).await.pods.is_empty());
    }

    #[tokio::test]
    async fn a_burst_of_renames_is_one_scan() {
        let dir = tempfile::tempdir().unwrap();
        let staging = tempfile::tempdir_in(dir.path()).unwrap();
        let manifests = dir.path().join("manifests");
        std::fs::create_dir(&manifests).unwrap();
        let src = StaticPodSource::new(&manifests, "n", Duration::from_secs(3600));
        let (tx, mut rx) = mpsc::channel(64);
        tokio::spawn(src.run(tx, CancellationToken::new()));
        let first = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
        assert!(first.pods.is_empty());
        for i in 0..20 {
            std::fs::write(staging.path().join(format!("p{i}.yaml")), POD.replace("NAME", &format!("p{i}"))).unwrap();
        }
        // The source task runs only once this (current-thread) test yields, with every event queued by then.
        for i in 0..20 {
            let f = format!("p{i}.yaml");
            std::fs::rename(staging.path().join(&f), manifests.join(&f)).unwrap();
        }
        let snap = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
        assert_eq!(snap.pods.len(), 20);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(rx.try_recv().is_err(), "one snapshot for the whole burst");
    }
}
