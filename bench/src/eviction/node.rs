//! Where a run's pods live: under a nodewarden daemon (the nodewarden agents), or placed by the bench itself
//! through the resources library with no daemon at all (the kernel and earlyoom agents, which must run alone).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use nodewarden_resources::ResourceManager;

use super::{Agent, Kind, MEMORY_THRESHOLD, MIB, Scenario};
use crate::{Guard, ROOT, config, get, manager, pods, remove_tree, root, wait, write};

/// One pod of a scenario.
pub struct PodDef {
    /// The manifest's name (the daemon's pod is `<name>-bench`).
    pub name: String,
    /// The container's command.
    pub argv: Vec<String>,
    /// The container's `resources`, as JSON (also valid YAML).
    pub resources: Option<serde_json::Value>,
    /// An emptyDir mounted at `/mnt`.
    pub volume: bool,
}

impl PodDef {
    fn manifest(&self) -> String {
        let argv: Vec<String> = self.argv.iter().map(|a| format!("'{a}'")).collect();
        let resources = self.resources.as_ref().map(|r| format!("    resources: {r}\n")).unwrap_or_default();
        let (mounts, volumes) = if self.volume {
            (
                "    volumeMounts:\n    - {name: data, mountPath: /mnt}\n",
                "  volumes:\n  - name: data\n    emptyDir: {}\n",
            )
        } else {
            ("", "")
        };
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {}\nspec:\n  restartPolicy: Never\n  \
             terminationGracePeriodSeconds: 5\n  containers:\n  - name: app\n    image: busybox\n    command: [{}]\n\
             {resources}{mounts}{volumes}",
            self.name,
            argv.join(", ")
        )
    }

    fn pod(&self) -> Result<Pod> {
        let mut c = serde_json::json!({"name": "app", "image": "busybox", "command": self.argv});
        if let Some(r) = &self.resources {
            c["resources"] = r.clone();
        }
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": pod_name(&self.name), "namespace": "default", "uid": uid(&self.name)},
            "spec": {"containers": [c]}
        }))?)
    }
}

/// The pod's name for a manifest's `name`: the daemon's static pod `<name>-bench` (the node is `bench`), and the
/// name the bench gives a pod it places itself.
pub fn pod_name(name: &str) -> String {
    format!("{name}-bench")
}

fn uid(name: &str) -> String {
    format!("bench-{name}")
}

/// The pods and whatever runs them.
pub enum Node {
    /// A nodewarden daemon on a static pod directory.
    Daemon { daemon: Guard, port: u16, manifests: PathBuf },
    /// Pods placed by the bench; their main processes.
    Direct { manager: Box<ResourceManager>, children: Vec<(String, Child)> },
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Node::Direct { children, .. } = self {
            remove_tree(&root());
            for (_, c) in children {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Node {
    /// Starts the agent's node in `dir` (the daemon's config, manifests and root go there; `base` is the
    /// scenario's file system).
    pub fn start(
        sc: &Scenario,
        agent: Agent,
        nodewarden: &Path,
        dir: &Path,
        base: &Path,
        threshold: f64,
    ) -> Result<Self> {
        if !agent.daemon() {
            return Ok(Node::Direct { manager: Box::new(manager(config(&root()))?), children: Vec::new() });
        }
        let manifests = base.join("manifests");
        std::fs::create_dir_all(&manifests)?;
        let hard = match sc.kind {
            Kind::Memory => format!("evictionHard:\n  memory.available: {}Mi\n", MEMORY_THRESHOLD / MIB),
            Kind::Pids => format!("evictionHard:\n  pid.available: '{threshold:.0}'\n"),
            Kind::Disk => "evictionHard:\n  nodefs.available: 25%\n".to_owned(),
        };
        let cadence = if agent == Agent::KubeletLike {
            "  housekeepingInterval: 10s\n  evictionPollMin: 10s\n  pressureEvents: false\n  evictionRealtimePriority: 0\n"
        } else {
            ""
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let fs_paths = if sc.kind == Kind::Disk {
            format!("  nodefsPath: {0}\n  imagefsPath: {0}\n", base.display())
        } else {
            String::new()
        };
        let cfg = dir.join("config.yaml");
        std::fs::write(
            &cfg,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupRoot: {ROOT}\n\
                 healthzPort: {port}\nstaticPodPath: {}\npodLogsDir: {}\nevictionPressureTransitionPeriod: 5s\n{hard}\
                 nodewarden:\n  rootDir: {}\n  nodeName: bench\n{cadence}{fs_paths}",
                manifests.display(),
                base.join("logs").display(),
                base.join("root").display(),
            ),
        )?;
        let log = std::fs::File::create(dir.join("daemon.log"))?;
        let child =
            Command::new(nodewarden).args(["run", "--config"]).arg(&cfg).stdout(Stdio::null()).stderr(log).spawn()?;
        let daemon = Guard(child);
        wait("nodewarden ready", 60, || get(port, "/readyz").is_some())?;
        Ok(Node::Daemon { daemon, port, manifests })
    }

    /// The daemon's PID, when there is one.
    pub fn daemon_pid(&self) -> Option<u32> {
        match self {
            Node::Daemon { daemon, .. } => Some(daemon.0.id()),
            Node::Direct { .. } => None,
        }
    }

    /// The daemon's port, when there is one.
    pub fn port(&self) -> Option<u16> {
        match self {
            Node::Daemon { port, .. } => Some(*port),
            Node::Direct { .. } => None,
        }
    }

    /// Starts a pod: a manifest for the daemon, or a placement and a process of the bench's own. A pod with a
    /// volume writes below `base` when the bench runs it (the argument `/mnt` is replaced).
    pub fn start_pod(&mut self, def: &PodDef, base: &Path) -> Result<()> {
        match self {
            Node::Daemon { manifests, .. } => write(manifests, &format!("{}.yaml", def.name), &def.manifest()),
            Node::Direct { manager, children } => {
                let placement = manager.place(&def.pod()?)?;
                let fs = manager.cgroupfs();
                let container = placement.containers.first().context("a pod without containers")?;
                let cg = if fs.exists(&container.cgroup) { &container.cgroup } else { &placement.cgroup };
                let volume = base.join(format!("volume-{}", def.name));
                if def.volume {
                    std::fs::create_dir_all(&volume)?;
                }
                let argv: Vec<String> = def
                    .argv
                    .iter()
                    .map(|a| if def.volume && a == "/mnt" { volume.display().to_string() } else { a.clone() })
                    .collect();
                // The shell joins the cgroup and takes the score before the workload starts (and forks).
                let child = Command::new("sh")
                    .args([
                        "-c",
                        "echo \"$1\" > /proc/self/oom_score_adj && echo $$ > \"$2\" && shift 2 && exec \"$@\"",
                    ])
                    .arg("sh")
                    .arg(container.oom_score_adj.to_string())
                    .arg(fs.file(cg, "cgroup.procs"))
                    .args(&argv)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .with_context(|| format!("cannot start {}", def.name))?;
                children.push((def.name.clone(), child));
                Ok(())
            }
        }
    }

    /// Whether each named pod runs now (no restart for the daemon's).
    pub fn running(&mut self, names: &[&str]) -> Vec<bool> {
        match self {
            Node::Daemon { port, .. } => {
                let list = pods(*port);
                names.iter().map(|n| pod(&list, n).is_some_and(is_running)).collect()
            }
            Node::Direct { children, .. } => names
                .iter()
                .map(|n| {
                    children.iter_mut().find(|(c, _)| c == n).is_some_and(|(_, c)| matches!(c.try_wait(), Ok(None)))
                })
                .collect(),
        }
    }

    /// Pod UIDs to pod names, to name the kernel's OOM kills.
    pub fn uids(&self) -> BTreeMap<String, String> {
        match self {
            Node::Daemon { port, .. } => pods(*port)
                .iter()
                .filter_map(|p| {
                    let uid = p["metadata"]["uid"].as_str()?.to_owned();
                    let name = p["metadata"]["name"].as_str()?.trim_end_matches("-bench").to_owned();
                    Some((uid, name))
                })
                .collect(),
            Node::Direct { children, .. } => children.iter().map(|(n, _)| (uid(n), n.clone())).collect(),
        }
    }
}

fn pod<'a>(list: &'a [serde_json::Value], name: &str) -> Option<&'a serde_json::Value> {
    list.iter().find(|p| p["metadata"]["name"] == pod_name(name).as_str())
}

fn is_running(p: &serde_json::Value) -> bool {
    p["status"]["phase"] == "Running"
        && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
        && p["status"]["containerStatuses"][0]["restartCount"] == 0
}

/// The scenario's file system and scratch directory, removed (with the cgroup tree) when dropped.
pub struct Setup {
    pub dir: PathBuf,
    pub base: PathBuf,
    mounted: bool,
}

impl Setup {
    /// A fresh directory; for the disk scenario, `base` is a tmpfs of [`super::DISK_SIZE_MIB`].
    pub fn new(kind: Kind) -> Result<Self> {
        remove_tree(&root());
        let dir = std::env::temp_dir().join(format!("nwbench-ev-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let base = dir.join("fs");
        std::fs::create_dir_all(&base)?;
        let mut setup = Self { dir, base, mounted: false };
        if kind == Kind::Disk {
            let st = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={}m", super::DISK_SIZE_MIB), "tmpfs"])
                .arg(&setup.base)
                .status()?;
            if !st.success() {
                bail!("cannot mount a tmpfs at {}", setup.base.display());
            }
            setup.mounted = true;
        }
        Ok(setup)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        remove_tree(&root());
        if self.mounted {
            let _ = Command::new("umount").arg(&self.base).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A child process killed when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
