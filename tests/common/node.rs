//! A daemon with static pods: its manifest, log and root directories, and helpers to read `/pods`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Daemon, get};

/// A daemon with a static pod directory, a log directory and a root directory of its own.
pub struct Node {
    pub d: Daemon,
    pub manifests: PathBuf,
    pub logs: PathBuf,
    pub root: PathBuf,
    /// A file system of the node's own. Last, so it is unmounted once the daemon (dropped first) is gone.
    pub tmpfs: Option<Tmpfs>,
}

/// A file system mounted for a test (a tmpfs, or an ext4 on a loop device), unmounted (lazily: the killed pods
/// may still hold files) when dropped, its loop device detached.
pub struct Tmpfs(PathBuf, Option<String>);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
        if let Some(dev) = &self.1 {
            let _ = std::process::Command::new("losetup").args(["-d", dev]).status();
        }
    }
}

pub fn node(name: &str) -> Node {
    node_with(name, "", "")
}

/// A node with more settings: `nodewarden` lines (indented two spaces) and top-level config lines.
pub fn node_with(name: &str, nodewarden: &str, top: &str) -> Node {
    node_in(tempfile::tempdir().unwrap().keep(), name, nodewarden, top)
}

/// A node whose manifest, log and root directories are below `dir`.
pub fn node_in(dir: PathBuf, name: &str, nodewarden: &str, top: &str) -> Node {
    let (manifests, logs, root) = (dir.join("manifests"), dir.join("logs"), dir.join("root"));
    std::fs::create_dir_all(&manifests).unwrap();
    let extra = format!(
        "  rootDir: {}\n  nodeName: vm\n{nodewarden}staticPodPath: {}\npodLogsDir: {}\n{top}",
        root.display(),
        manifests.display(),
        logs.display()
    );
    let mut d = Daemon::new(name, &extra);
    d.start();
    d.wait_ready();
    Node { d, manifests, logs, root, tmpfs: None }
}

/// A node whose directories, nodefs and imagefs are a tmpfs of `mib` MiB of its own, so what its pods write
/// fills nothing another test's daemon measures (tests run in parallel on the VM's one small root).
pub fn node_on_tmpfs(mib: u64, name: &str, nodewarden: &str, top: &str) -> Node {
    node_on_tmpfs_with(&format!("size={mib}m"), name, nodewarden, top)
}

/// [`node_on_tmpfs`] with the tmpfs mounted with `options` (`size=64m,nr_inodes=2000`).
pub fn node_on_tmpfs_with(options: &str, name: &str, nodewarden: &str, top: &str) -> Node {
    let dir = tempfile::tempdir().unwrap().keep();
    let status =
        std::process::Command::new("mount").args(["-t", "tmpfs", "-o", options, "tmpfs"]).arg(&dir).status().unwrap();
    assert!(status.success(), "cannot mount a tmpfs at {}", dir.display());
    let mounted = Tmpfs(dir.clone(), None);
    let fs = format!("  nodefsPath: {0}\n  imagefsPath: {0}\n{nodewarden}", dir.display());
    let mut n = node_in(dir, name, &fs, top);
    n.tmpfs = Some(mounted);
    n
}

/// A node whose directories, nodefs and imagefs are an ext4 of `mib` MiB of its own on a loop device, made with
/// `mkfs_options` (`-O quota,project` for project quotas, mounted with `prjquota` then).
pub fn node_on_ext4(mib: u64, name: &str, mkfs_options: &[&str], top: &str) -> Node {
    let run = |cmd: &str, args: &[&str]| {
        let out = std::process::Command::new(cmd).args(args).output().unwrap();
        assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let image = tempfile::NamedTempFile::new().unwrap();
    image.as_file().set_len(mib << 20).unwrap();
    let image = image.path().to_str().unwrap();
    run("mkfs.ext4", &[&["-q", "-F"][..], mkfs_options, &[image]].concat());
    let dev = run("losetup", &["-f", "--show", image]);
    let dir = tempfile::tempdir().unwrap().keep();
    let quota = mkfs_options.iter().any(|o| o.contains("project"));
    let options = if quota { "prjquota" } else { "defaults" };
    run("mount", &["-t", "ext4", "-o", options, &dev, dir.to_str().unwrap()]);
    let mounted = Tmpfs(dir.clone(), Some(dev));
    let fs = format!("  nodefsPath: {0}\n  imagefsPath: {0}\n", dir.display());
    let mut n = node_in(dir, name, &fs, top);
    n.tmpfs = Some(mounted);
    n
}

pub fn pod_yaml(name: &str, body: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n{body}")
}

impl Node {
    /// `/pods`. A debug-build daemon in the emulated VM, busy starting 100 containers next to other tests'
    /// daemons, has been measured answering after more than the client's 10 s: up to three tries.
    pub fn pods(&self) -> Vec<Value> {
        let (status, body) = (0..3)
            .find_map(|_| get(self.d.port, "/pods"))
            .unwrap_or_else(|| panic!("GET /pods failed three times\n{}", self.d.log()));
        assert_eq!(status, 200);
        let list: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(list["kind"], "PodList");
        list["items"].as_array().unwrap().clone()
    }

    pub fn pod(&self, name: &str) -> Option<Value> {
        let full = format!("{name}-vm");
        self.pods().into_iter().find(|p| p["metadata"]["name"] == full.as_str())
    }

    /// Waits until pod `name` satisfies `f`; returns it.
    pub fn wait_pod(&self, name: &str, secs: u64, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Some(p) = self.pod(name).filter(|p| f(p)) {
                return p;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("pod {name} never {what} within {secs}s: {:#?}\n{}", self.pod(name), self.d.log());
    }

    pub fn write(&self, file: &str, text: &str) {
        // Written beside and renamed into place, as config management does.
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.manifests.join(file)).unwrap();
    }

    pub fn pod_cgroup(&self, p: &Value) -> PathBuf {
        let uid = p["metadata"]["uid"].as_str().unwrap();
        let qos = match p["status"]["qosClass"].as_str().unwrap() {
            "Guaranteed" => String::new(),
            q => format!("{}/", q.to_lowercase()),
        };
        self.d.cgroup(&format!("kubepods/{qos}pod{uid}"))
    }
}

pub fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or_default()
}

pub fn container<'a>(p: &'a Value, name: &str) -> &'a Value {
    p["status"]["containerStatuses"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap()
}

/// A static pod directory below `dir` with one pod, `quiet`, whose container sleeps.
pub fn quiet_manifests(dir: &std::path::Path) -> PathBuf {
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("quiet.yaml"),
        pod_yaml("quiet", "  containers:\n  - name: app\n    image: busybox\n    command: [sleep, '100000']\n"),
    )
    .unwrap();
    manifests
}

/// The first pod's first container from `/pods` on `port`, as its ID and start time: unchanged means untouched.
pub fn first_container(port: u16) -> Option<String> {
    let (_, body) = get(port, "/pods")?;
    let pods: Value = serde_json::from_str(&body).ok()?;
    let c = &pods["items"].as_array()?.first()?["status"]["containerStatuses"][0];
    Some(format!("{} {}", c["containerID"], c["state"]["running"]["startedAt"].as_str()?))
}
