//! End-to-end tests of the `nodewarden` binary. The ones that need the cgroup v2 hierarchy run inside the VM of
//! `deploy/vm` (NODEWARDEN_VM_TESTS=1 makes a missing cgroup v2 a failure there) and skip elsewhere; the refusal
//! tests run anywhere.
#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]
#![expect(clippy::disallowed_types, reason = "waits for a real process, in real time")]

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use nodewarden_resources::CgroupPath;

/// `promtool check metrics` (Debian's prometheus package) must accept the exposition: format and naming lints.
/// Required in the VM run, where the test command has installed it; skipped elsewhere when it is missing.
fn promtool_check(text: &str) {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if std::env::var_os("NODEWARDEN_VM_TESTS").is_none() => {
            eprintln!("skipped promtool check: {e}");
            return;
        }
        Err(e) => panic!("promtool is needed for this test: {e}"),
    };
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // The one finding allowed: the kubelet's own name for its eviction counter has no `_total` suffix, and
    // dashboards use that name.
    let findings: Vec<&str> = report.lines().filter(|l| !l.trim().is_empty()).collect();
    let allowed = |l: &&str| l.starts_with("kubelet_evictions ") && l.contains("_total");
    assert!(findings.iter().all(allowed), "promtool check metrics:\n{report}");
    assert_eq!(findings.len(), 1, "promtool should flag kubelet_evictions (and only it):\n{report}");
    assert!(out.status.success() || out.status.code() == Some(3), "promtool failed:\n{report}");
}

#[test]
fn serves_endpoints_and_enforces_allocatable() {
    if !cgroup2_available() {
        return;
    }
    let mut d = Daemon::new("serve", "");
    d.start();
    d.wait_ready();

    let total = meminfo("MemTotal");
    let limit: u64 = std::fs::read_to_string(d.cgroup("kubepods/memory.max")).unwrap().trim().parse().unwrap();
    assert_eq!(limit, total - 80 * MIB, "kubepods memory.max = capacity − systemReserved − kubeReserved");

    assert_eq!(get(d.port, "/healthz"), Some((200, "ok".into())));
    let (status, body) = get(d.port, "/readyz").unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("[+]eviction ok") && body.contains("[+]cgroupfs ok"), "{body}");

    let (status, text) = get(d.port, "/metrics").unwrap();
    assert_eq!(status, 200);
    // The default hard threshold, and allocatable as admission sees it (the threshold subtracted as well).
    assert_eq!(
        metric(&text, "kubelet_eviction_stats{eviction_signal=\"memory.available\"}"),
        Some((100 * MIB) as f64),
        "{text}"
    );
    let alloc = metric(&text, "nodewarden_node_allocatable{resource=\"memory\",unit=\"byte\"}").unwrap();
    assert_eq!(alloc, (total - 180 * MIB) as f64);
    let enforced = metric(&text, "nodewarden_node_allocatable_enforced{resource=\"memory\",unit=\"byte\"}").unwrap();
    assert_eq!(enforced, limit as f64);
    // memory.available never exceeds the kernel's MemAvailable (the daemon's reading of it, or ours just after,
    // as it moves). A scrape is not atomic: its two gauges can come from two passes a few KiB apart, so a scrape
    // that tore across a pass is taken again; a daemon that ignores MemAvailable fails every one.
    let within = |text: &str| {
        let available = metric(text, "nodewarden_eviction_signal_value{eviction_signal=\"memory.available\"}").unwrap();
        let mem_available = (meminfo("MemAvailable") as f64)
            .max(metric(text, "nodewarden_node_memory_bytes{kind=\"mem_available\"}").unwrap());
        (available > 0.0 && available <= mem_available, format!("{available} > MemAvailable {mem_available}"))
    };
    let mut seen = Vec::new();
    let consistent =
        std::iter::once(text.clone()).chain((0..4).filter_map(|_| get(d.port, "/metrics").map(|(_, t)| t))).any(|t| {
            let (ok, why) = within(&t);
            seen.push(why);
            ok
        });
    assert!(consistent, "memory.available above MemAvailable in every scrape: {seen:?}");
    assert!(metric(&text, "nodewarden_eviction_signal_value{eviction_signal=\"pid.available\"}").unwrap() > 0.0);
    assert!(text.contains("process_resident_memory_bytes"), "process metrics missing");
    promtool_check(&text);

    let (status, configz) = get(d.port, "/configz").unwrap();
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&configz).unwrap();
    assert_eq!(v["kubeletconfig"]["cgroupRoot"], d.root.as_str());
    assert_eq!(v["kubeletconfig"]["evictionHard"]["memory.available"], "100Mi");

    assert!(d.log().contains("authentication"), "ignored kubelet fields are reported:\n{}", d.log());
    // The eviction thread, alone of the daemon's threads, runs under SCHED_FIFO (nodewarden.evictionRealtimePriority).
    let policies = thread_policies(d.pid().unwrap());
    let fifo: Vec<&str> = policies.iter().filter(|(_, p)| *p == 1).map(|(n, _)| n.as_str()).collect();
    assert_eq!(fifo, ["eviction"], "{policies:?}");
    assert_eq!(d.stop(), Some(0), "clean exit on SIGTERM:\n{}", d.log());
    assert!(d.cgroup("kubepods").is_dir(), "the tree is left in place");
}

/// Each thread of `pid`: its name and its scheduling policy (field 41 of its `stat`; 1 is `SCHED_FIFO`).
fn thread_policies(pid: u32) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else { continue };
        let (name, fields) = nodewarden_testkit::proc_stat_fields(&stat).unwrap();
        out.push((name.to_owned(), fields[38].parse().unwrap()));
    }
    out
}

#[test]
fn a_restart_adopts_running_pods_without_touching_them() {
    if !cgroup2_available() {
        return;
    }
    let mut d = Daemon::new("adopt", "");
    d.start();
    d.wait_ready();
    assert_eq!(d.stop(), Some(0));

    // A pod placed by an earlier run, with a process still running in its container cgroup.
    let pod = d.cgroup("kubepods/besteffort/pod0f4e2c1a-aaaa-4bbb-8ccc-123456789abc");
    std::fs::create_dir(&pod).unwrap();
    std::fs::write(pod.join("cgroup.subtree_control"), "+memory +pids +cpu").unwrap();
    std::fs::create_dir(pod.join("app")).unwrap();
    let mut sleeper = Command::new("sh")
        .arg("-c")
        .arg(format!("echo $$ > {} && exec sleep 600", pod.join("app/cgroup.procs").display()))
        .spawn()
        .unwrap();

    d.start();
    d.wait_ready();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut pods = None;
    while Instant::now() < deadline && pods != Some(1.0) {
        pods = get(d.port, "/metrics").and_then(|(_, t)| metric(&t, "nodewarden_pods{qos_class=\"BestEffort\"}"));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(pods, Some(1.0), "the existing pod was not adopted:\n{}", d.log());
    assert!(d.log().contains("0f4e2c1a-aaaa-4bbb-8ccc-123456789abc"), "{}", d.log());
    assert_eq!(d.stop(), Some(0));
    assert!(sleeper.try_wait().unwrap().is_none(), "the pod's process must survive the daemon's restart");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn readyz_fails_when_the_kubepods_cgroup_is_gone() {
    if !cgroup2_available() {
        return;
    }
    let mut d = Daemon::new("readyz", "");
    d.start();
    d.wait_ready();
    for rel in ["kubepods/burstable", "kubepods/besteffort", "kubepods"] {
        std::fs::remove_dir(d.cgroup(rel)).unwrap();
    }
    let (status, body) = get(d.port, "/readyz").unwrap();
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("[-]cgroupfs failed"), "{body}");
    assert!(body.contains("readyz check failed"), "{body}");
    assert_eq!(get(d.port, "/healthz").map(|r| r.0), Some(200), "the process is still alive");
}

/// Runs `nodewarden run` on `cfg` for at most `secs`: its exit code (`None` if it was still running and was
/// killed) and stderr.
fn run_for(cfg: &Path, secs: u64, until: impl Fn() -> bool) -> (Option<i32>, String) {
    let mut child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline || until() {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
    (code, stderr)
}

#[test]
fn controllers_a_parent_offers_are_enabled_and_a_parent_that_cannot_delegate_is_refused() {
    if !cgroup2_available() {
        return;
    }
    let _tunables = kernel_tunables();
    let config = |root: &str| {
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupRoot: {root}\nhealthzPort: 0\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");

    // A parent that delegates only memory: cpu and pids, which it has, are enabled for the root below it, as the
    // kubelet's cgroupfs driver does (a systemd host enables at the root only what its units need).
    let parent_cg = CgroupPath::parse("/nwtest-d-noctl").unwrap();
    let parent = Path::new(MOUNT).join("nwtest-d-noctl");
    remove_tree(&parent_cg);
    std::fs::create_dir(&parent).unwrap();
    std::fs::write(parent.join("cgroup.subtree_control"), "+memory").unwrap();
    std::fs::write(&cfg, config("/nwtest-d-noctl/root")).unwrap();
    let started = || parent.join("root/kubepods").exists();
    let (code, stderr) = run_for(&cfg, 60, started);
    assert_eq!(code, None, "the daemon did not start: {stderr}");
    let enabled = std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap();
    assert!(enabled.contains("cpu") && enabled.contains("pids"), "{enabled}");
    assert!(stderr.contains("enabled controllers for the cgroup root's subtree"), "{stderr}");
    remove_tree(&parent_cg);

    // A parent with a process in it cannot delegate anything (the kernel's no-internal-process rule): the start
    // is refused with what is missing, and nothing is created.
    std::fs::create_dir(&parent).unwrap();
    let mut sleeper = Command::new("sleep").arg("300").spawn().unwrap();
    std::fs::write(parent.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    let (code, stderr) = run_for(&cfg, 60, || false);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("cpu, memory, pids") && stderr.contains("deploy/vm"), "{stderr}");
    assert!(!parent.join("root").exists(), "nothing is created when the start is refused");
    remove_tree(&parent_cg);
}

#[test]
fn refuses_a_mount_that_is_not_cgroup2() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nhealthzPort: 0\nnodewarden:\n  cgroupMount: {}\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let out = Command::new(BIN).args(["run", "--config"]).arg(&cfg).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("is not a cgroup v2") && stderr.contains("deploy/vm"), "{stderr}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "only the config file: no half-made tree");
}

#[test]
fn check_config_names_the_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard:\n  nodefs.available: 150%\n").unwrap();
    let out = Command::new(BIN).arg("check-config").arg(&cfg).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("evictionHard.nodefs.available"), "{stderr}");
    let run = Command::new(BIN).args(["run", "--config"]).arg(&cfg).output().unwrap();
    assert_eq!(run.status.code(), Some(2));

    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/config.yaml");
    let out = Command::new(BIN).arg("check-config").arg(&example).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let effective = String::from_utf8_lossy(&out.stdout);
    assert!(effective.contains("evictionPressureTransitionPeriod: 5m0s"), "{effective}");
    assert!(effective.contains("maxPods: 110"), "{effective}");
}

#[test]
fn sigterm_is_not_held_up_by_an_open_connection() {
    if !cgroup2_available() {
        return;
    }
    let mut d = Daemon::new("drain", "");
    d.start();
    d.wait_ready();
    // A client that sent half a request and then went quiet.
    let mut idle = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    idle.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    assert_eq!(d.stop(), Some(0), "{}", d.log());
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "shutdown took {took:?}");
    drop(idle);
}

/// Every directory below `dir` with its limits and processes, to show that nothing changed.
fn cgroup_snapshot(dir: &Path) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let read = |f: &str| std::fs::read_to_string(d.join(f)).unwrap_or_default();
        out.push((d.display().to_string(), read("memory.max"), read("cgroup.procs")));
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_second_daemon_on_the_same_root_exits_and_changes_nothing() {
    if !cgroup2_available() {
        return;
    }
    let mut d = Daemon::new("lock", "");
    d.start();
    d.wait_ready();
    let before = cgroup_snapshot(&d.cgroup(""));
    let second = Command::new(BIN).args(["run", "--config"]).arg(d.config_path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("another nodewarden is running"), "{stderr}");
    assert!(stderr.contains(&format!("PID {}", d.pid().unwrap())), "{stderr}");
    assert_eq!(cgroup_snapshot(&d.cgroup("")), before, "the second daemon changed the cgroup tree");
    assert_eq!(get(d.port, "/readyz").map(|r| r.0), Some(200), "{}", d.log());
    assert_eq!(d.stop(), Some(0), "{}", d.log());
    // Once the first has stopped, a daemon on the same root starts.
    d.start();
    d.wait_ready();
    assert_eq!(d.stop(), Some(0), "{}", d.log());
}

#[test]
fn a_flood_of_stalled_connections_leaves_the_daemon_serving_and_evicting() {
    if !cgroup2_available() {
        return;
    }
    // The flood needs more descriptors than the usual soft limit of 1024.
    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit { current: nofile.maximum, maximum: nofile.maximum },
    )
    .unwrap();
    let mut d = Daemon::new("flood", "");
    d.start();
    d.wait_ready();
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.pid().unwrap())).unwrap();
    let open_files = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    assert!(open_files.contains("1000000"), "maxOpenFiles is not in force: {open_files}");
    let mut flood = Vec::new();
    for i in 0..1200 {
        let mut s = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
        // Half of them stall after part of a request line, half dribble a header now and then.
        s.write_all(if i % 2 == 0 { b"GET /metr".as_slice() } else { b"GET /metrics HTTP/1.1\r\n".as_slice() })
            .unwrap();
        flood.push(s);
    }
    for round in 0..5 {
        for s in flood.iter_mut().skip(1).step_by(2) {
            let _ = s.write_all(format!("X-{round}: y\r\n").as_bytes());
        }
        assert_eq!(get(d.port, "/healthz").map(|r| r.0), Some(200), "{}", d.log());
        // /readyz is 200 only while eviction passes keep completing.
        assert_eq!(get(d.port, "/readyz").map(|r| r.0), Some(200), "{}", d.log());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(!d.log().contains("cannot observe"), "{}", d.log());
    drop(flood);
    assert_eq!(d.stop(), Some(0), "{}", d.log());
}

#[test]
fn protect_kernel_defaults_refuses_a_differing_tunable_and_otherwise_sets_it() {
    if !cgroup2_available() {
        return;
    }
    let _tunables = kernel_tunables();
    let panic = Path::new("/proc/sys/kernel/panic");
    std::fs::write(panic, "0").unwrap();
    let mut d = Daemon::new("kdefaults", "protectKernelDefaults: true\n");
    let out = Command::new(BIN).args(["run", "--config"]).arg(d.config_path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("kernel.panic is 0, the kubelet needs 10"), "{stderr}");
    assert_eq!(std::fs::read_to_string(panic).unwrap().trim(), "0", "nothing is set with the flag on");
    // Without the flag the daemon sets it, and says so.
    let config = std::fs::read_to_string(d.config_path()).unwrap().replace("protectKernelDefaults: true", "");
    std::fs::write(d.config_path(), config).unwrap();
    d.start_unlocked();
    d.wait_ready();
    assert_eq!(std::fs::read_to_string(panic).unwrap().trim(), "10");
    assert!(d.log().contains("set a kernel tunable the kubelet needs"), "{}", d.log());
    assert_eq!(d.stop(), Some(0));
}

#[test]
fn the_systemd_cgroup_driver_is_refused_where_systemd_is_not_the_init() {
    if !cgroup2_available() || std::fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim() == "systemd") {
        return;
    }
    let d = Daemon::new("sdrefused", "cgroupDriver: systemd\n");
    let out = Command::new(BIN).args(["run", "--config"]).arg(d.config_path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("cgroupDriver: systemd needs systemd as PID 1"), "{stderr}");
    // Nothing was made: neither the slices nor the cgroupfs layout.
    for made in ["nwtest_d_sdrefused.slice", "nwtest-d-sdrefused", "kubepods.slice"] {
        assert!(!Path::new(MOUNT).join(made).exists(), "{made} was created");
    }
}
