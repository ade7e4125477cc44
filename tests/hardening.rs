//! The second hardening round, end to end with the real kernel (inside the VM of `deploy/vm`; skipped where cgroup
//! v2 is missing): a container ends with its main process, adoption takes only the saved main process, a deleting
//! pod keeps its grace period across a restart, a chatty probe passes, a vanished container cgroup is made again,
//! the endpoints' port held at a restart, a daemon out of PIDs, the lock without its file, a full rootDir, and a
//! signal during a long start.
#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]
#![expect(clippy::disallowed_types, reason = "waits for real processes, in real time")]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn procs(cg: &Path) -> Vec<u32> {
    std::fs::read_to_string(cg.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect()
}

fn recorded_pids(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect()
}

fn restarts(p: &Value) -> u64 {
    container(p, "app")["restartCount"].as_u64().unwrap_or(0)
}

#[test]
fn a_container_ends_with_its_main_process() {
    if !cgroup2_available() {
        return;
    }
    let n = node("leftovers");
    let children = n.root.parent().unwrap().join("children");
    // Each run leaves a child behind (which would keep a port, memory and PIDs) and exits.
    let body = format!(
        "  containers:\n  - name: app\n    image: busybox\n    \
         command: [sh, -c, 'sleep 1000 & echo $! >> {}; sleep 1; exit 1']\n",
        children.display()
    );
    n.write("leaver.yaml", &pod_yaml("leaver", &body));
    let p = n.wait_pod("leaver", 60, "was restarted twice", |p| restarts(p) >= 2);
    let cg = n.pod_cgroup(&p).join("app");
    let left = recorded_pids(&children);
    assert!(left.len() >= 2, "{left:?}");
    // Every run before the current one has ended with all it started; the current one has at most its own.
    for pid in &left[..left.len() - 1] {
        assert!(!alive(*pid), "the child {pid} of an earlier run still runs (in {:?})", procs(&cg));
    }
}

#[test]
fn a_main_process_that_died_while_the_daemon_was_down_is_restarted() {
    if !cgroup2_available() {
        return;
    }
    let mut n = node("unseen");
    let body = "  containers:\n  - name: app\n    image: busybox\n    \
                command: [sh, -c, 'sleep 1000 & while true; do sleep 1; done']\n";
    n.write("unseen.yaml", &pod_yaml("unseen", body));
    let p = n.wait_pod("unseen", 15, "ran", |p| phase(p) == "Running");
    let cg = n.pod_cgroup(&p).join("app");
    wait_until(10, "the container's child runs", || procs(&cg).len() >= 2);
    let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let cmdline = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let main = *procs(&cg).iter().find(|p| comm(**p).trim() == "sh").unwrap();
    let child = *procs(&cg).iter().find(|p| cmdline(**p).contains("1000") && **p != main).unwrap();
    n.d.kill();
    Command::new("kill").args(["-9", &main.to_string()]).status().unwrap();
    wait_until(5, "the main process is gone", || !alive(main));
    n.d.start();
    n.d.wait_ready();
    // Not adopted through the child it left: seen exited, restarted, and the child killed.
    let p = n.wait_pod("unseen", 20, "was restarted", |p| restarts(p) == 1 && phase(p) == "Running");
    assert_eq!(container(&p, "app")["lastState"]["terminated"]["reason"], "ContainerStatusUnknown");
    wait_until(5, "the dead run's child is killed", || !alive(child));
    assert!(!procs(&cg).contains(&main));
}

#[test]
fn a_deleting_pod_keeps_its_grace_period_across_a_restart() {
    if !cgroup2_available() {
        return;
    }
    // Only the deletion may end the pod: no eviction for what other tests use of the VM's memory and disk.
    let mut n = node_with("grace", "", "evictionHard:\n  memory.available: 1Mi\n");
    let body = "  terminationGracePeriodSeconds: 45\n  containers:\n  - name: app\n    image: busybox\n    \
                command: [sh, -c, 'trap \"\" TERM; while true; do sleep 0.2; done']\n";
    n.write("slow.yaml", &pod_yaml("slow", body));
    let p = n.wait_pod("slow", 15, "ran", |p| phase(p) == "Running");
    let cg = n.pod_cgroup(&p);
    let t0 = Instant::now();
    std::fs::remove_file(n.manifests.join("slow.yaml")).unwrap();
    // The deletion is under way (and saved) before the daemon restarts.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(n.d.stop(), Some(0));
    n.d.start();
    n.d.wait_ready();
    // An orphan without a saved deletion would be killed 30 s after the restart.
    while t0.elapsed() < Duration::from_secs(38) {
        if procs(&cg.join("app")).is_empty() {
            let log = n.d.log();
            let about: Vec<&str> = log.lines().filter(|l| l.contains("slow") || l.contains("evict")).collect();
            panic!("killed after {:?}, within its 45 s grace; the daemon said:\n{}", t0.elapsed(), about.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    wait_until(25, "the pod's cgroup is removed after its grace period", || !cg.exists());
    let took = t0.elapsed();
    assert!(took >= Duration::from_secs(44), "{took:?}");
    eprintln!("a 45 s grace period across a restart ended after {took:?}");
}

#[test]
fn a_chatty_probe_passes_and_env_values_are_not_served() {
    if !cgroup2_available() {
        return;
    }
    let n = node("chatty");
    // About 290 KB, far more than a pipe holds.
    let body = "  containers:\n  - name: app\n    image: busybox\n    command: [sleep, '1000']\n    env:\n    \
                - name: PASSWORD\n      value: hunter2\n    livenessProbe:\n      exec:\n        \
                command: [seq, '1', '50000']\n      periodSeconds: 1\n      failureThreshold: 1\n    \
                readinessProbe:\n      exec:\n        command: [seq, '1', '50000']\n      periodSeconds: 1\n";
    n.write("chatty.yaml", &pod_yaml("chatty", body));
    n.wait_pod("chatty", 20, "became ready", |p| container(p, "app")["ready"] == true);
    std::thread::sleep(Duration::from_secs(8));
    let p = n.pod("chatty").unwrap();
    assert_eq!(restarts(&p), 0, "{p:#}");
    assert_eq!(container(&p, "app")["ready"], true);
    let (_, text) = get(n.d.port, "/pods").unwrap();
    assert!(!text.contains("hunter2") && text.contains("(redacted)"), "env values are served: {text}");
}

#[test]
fn a_container_cgroup_that_vanished_is_made_again() {
    if !cgroup2_available() {
        return;
    }
    let n = node("vanish");
    let body = "  containers:\n  - name: app\n    image: busybox\n    command: [sh, -c, 'sleep 3; exit 1']\n";
    n.write("vanish.yaml", &pod_yaml("vanish", body));
    let p = n.wait_pod("vanish", 20, "exited and waits to restart", |p| {
        container(p, "app")["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    });
    let cg = n.pod_cgroup(&p).join("app");
    std::fs::remove_dir(&cg).unwrap();
    // Each run after the removal ran its command (exit 1), none failed to start (128, StartError).
    let p = n.wait_pod("vanish", 60, "was restarted twice", |p| restarts(p) >= 2);
    assert_eq!(container(&p, "app")["lastState"]["terminated"]["exitCode"], 1, "{p:#}");
    assert!(cg.is_dir(), "the container cgroup was made again");
}

#[test]
fn a_held_port_delays_the_endpoints_not_the_pods() {
    if !cgroup2_available() {
        return;
    }
    let mut n = node("held");
    n.write(
        "one.yaml",
        &pod_yaml("one", "  containers:\n  - name: app\n    image: busybox\n    command: [sleep, '1000']\n"),
    );
    let p = n.wait_pod("one", 15, "ran", |p| phase(p) == "Running");
    let one = n.pod_cgroup(&p).join("app");
    n.d.stop();
    // A local process takes the port while the daemon is down.
    let holder = std::net::TcpListener::bind(("127.0.0.1", n.d.port)).unwrap();
    n.d.start_unlocked();
    wait_until(30, "the daemon says the port is held, by whom", || {
        n.d.log().contains("cannot listen on healthzBindAddress")
            && n.d.log().contains(&format!("PID {}", std::process::id()))
    });
    // Pod sync runs: the adopted pod keeps running and a new manifest starts.
    n.write(
        "two.yaml",
        &pod_yaml("two", "  containers:\n  - name: app\n    image: busybox\n    command: [sleep, '1001']\n"),
    );
    let two = n.d.cgroup("kubepods/besteffort");
    wait_until(20, "the new pod runs", || {
        std::fs::read_dir(&two).unwrap().flatten().any(|e| {
            e.path().join("app/cgroup.procs").exists()
                && procs(&e.path().join("app"))
                    .iter()
                    .any(|p| std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default().contains("1001"))
        })
    });
    assert!(!procs(&one).is_empty(), "the adopted pod keeps running");
    assert!(!n.d.exited(), "the daemon runs on");
    drop(holder);
    n.d.wait_ready();
    assert_eq!(get(n.d.port, "/healthz"), Some((200, "ok".into())));
}

#[test]
fn a_daemon_out_of_pids_does_not_panic_and_runs_the_pod_once_they_are_back() {
    if !cgroup2_available() {
        return;
    }
    let n = node("pids");
    let own = n.d.cgroup("nodewarden");
    let max = own.join("pids.max");
    assert!(max.exists(), "the daemon's cgroup has the pids controller");
    // Idle longer than a blocking thread used to be kept (10 s): none is left to take the next blocking work.
    std::thread::sleep(Duration::from_secs(12));
    let current = std::fs::read_to_string(own.join("pids.current")).unwrap();
    std::fs::write(&max, current.trim()).unwrap();
    n.write(
        "late.yaml",
        &pod_yaml("late", "  containers:\n  - name: app\n    image: busybox\n    command: [sleep, '1000']\n"),
    );
    std::thread::sleep(Duration::from_secs(5));
    std::fs::write(&max, "max").unwrap();
    n.wait_pod("late", 30, "ran once PIDs were back", |p| phase(p) == "Running");
    let log = n.d.log();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn removing_the_lock_file_lets_no_second_daemon_in() {
    if !cgroup2_available() {
        return;
    }
    let mut n = node("lock");
    std::fs::remove_file(n.root.join("nodewarden.lock")).unwrap();
    let mut second = Daemon::new("lock2", &format!("  rootDir: {}\n", n.root.display()));
    second.start();
    wait_until(30, "the second daemon exits", || second.exited());
    assert!(second.log().contains("another nodewarden is running"), "{}", second.log());
    assert!(!n.d.exited());
}

#[test]
fn a_first_start_on_a_full_root_dir_runs() {
    if !cgroup2_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    assert!(
        Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"]).arg(&root).status().unwrap().success()
    );
    let _ = Command::new("dd").args(["if=/dev/zero", "bs=64k"]).arg(format!("of={}/fill", root.display())).status();
    let mut d = Daemon::new("full", &format!("  rootDir: {}\n", root.display()));
    d.start();
    d.wait_ready();
    assert!(d.log().contains("cannot write the daemon's PID"), "{}", d.log());
    drop(d);
    let _ = Command::new("umount").arg("-l").arg(&root).status();
}

#[test]
fn a_signal_while_the_runtime_is_awaited_takes_the_shutdown_path() {
    if !cgroup2_available() {
        return;
    }
    // A CRI endpoint that accepts and never answers.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("silent.sock");
    let _silent = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let mut d = Daemon::new("signal", &format!("containerRuntimeEndpoint: unix://{}\n", sock.display()));
    d.start_unlocked();
    std::thread::sleep(Duration::from_secs(3));
    assert!(!d.exited(), "{}", d.log());
    let t = Instant::now();
    assert_eq!(d.stop(), Some(0), "ended by the shutdown path, not by the signal");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(d.log().contains("shutting down during start"), "{}", d.log());
}
