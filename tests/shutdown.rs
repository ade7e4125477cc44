//! Graceful node shutdown under systemd as PID 1, with a real `systemctl poweroff` (a VM boot of its own:
//! `NODEWARDEN_VM_INIT=systemd deploy/vm/run`; skipped elsewhere). Pods of three priorities that ignore SIGTERM
//! are terminated group by group, each group at the end of its share of the shutdown period, critical pods last;
//! they end `Failed` with the kubelet's reason and message; logind waits for the daemon's delay lock (its
//! `InhibitDelayMaxSec` raised to the period). The guest powers off when the daemon releases the lock, so the test
//! writes its own exit status (`NODEWARDEN_VM_RC_FILE`) before that (its unit is not stopped by the shutdown).
#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]
#![expect(clippy::disallowed_types, reason = "waits for real processes, in real time")]

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const UNIT: &str = "nodewarden-shutdown.service";

/// Each group's share of the shutdown.
const SHARE: Duration = Duration::from_secs(3);

fn systemctl(args: &[&str]) -> (bool, String) {
    let out = Command::new("systemctl").args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// A pod of `priority` (a `spec.priority`, or a priority class) whose container runs `command`.
fn prioritized(name: &str, priority: &str, command: &str) -> String {
    pod_yaml(
        name,
        &format!(
            "  {priority}\n  terminationGracePeriodSeconds: 30\n  containers:\n  - name: app\n    image: busybox\n    \
             command: [sh, -c, '{command}']\n"
        ),
    )
}

#[test]
fn a_poweroff_terminates_the_pods_by_priority_within_their_shares() {
    // Only in the VM's systemd boot: the test powers the machine off.
    let vm = std::env::var_os("NODEWARDEN_VM_SYSTEMD").and(std::env::var_os("NODEWARDEN_VM_RC_FILE"));
    let Some(rc_file) = vm else {
        eprintln!("skipped: not the VM's systemd boot (NODEWARDEN_VM_SYSTEMD, NODEWARDEN_VM_RC_FILE)");
        return;
    };
    let comm = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    assert_eq!(comm.trim(), "systemd", "PID 1 is not systemd");

    let d = Daemon::new("shutdown", "");
    let manifests = d.dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    // The low and mid pods ignore SIGTERM, so each ends when its group's share is over; the critical one stops
    // at once, so the shutdown goes on as soon as the daemon releases its lock, well before logind would.
    let stubborn = "trap \"\" TERM; exec sleep 100000";
    for (name, priority, command) in [
        ("low", "priority: 0", stubborn),
        ("mid", "priority: 1000", stubborn),
        ("critical", "priorityClassName: system-node-critical", "exec sleep 100000"),
    ] {
        std::fs::write(manifests.join(format!("{name}.yaml")), prioritized(name, priority, command)).unwrap();
    }
    let secs = SHARE.as_secs();
    let config = std::fs::read_to_string(d.config_path()).unwrap();
    std::fs::write(
        d.config_path(),
        format!(
            "{config}staticPodPath: {}\nshutdownGracePeriodByPodPriority:\n\
             - {{priority: 0, shutdownGracePeriodSeconds: {secs}}}\n\
             - {{priority: 1000, shutdownGracePeriodSeconds: {secs}}}\n\
             - {{priority: 2000000000, shutdownGracePeriodSeconds: {secs}}}\n",
            manifests.display()
        ),
    )
    .unwrap();
    let unit = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nodewarden.service"))
        .unwrap()
        .replace("/usr/local/bin/nodewarden", BIN)
        .replace("/etc/nodewarden/config.yaml", &d.config_path().display().to_string());
    std::fs::write(format!("/run/systemd/system/{UNIT}"), unit).unwrap();
    // The test reads the last group's end from /pods after the lock is released: the daemon is stopped 2 s later.
    let dropin = format!("/run/systemd/system/{UNIT}.d");
    std::fs::create_dir_all(&dropin).unwrap();
    std::fs::write(format!("{dropin}/test.conf"), "[Service]\nExecStop=/bin/sleep 2\n").unwrap();
    assert!(systemctl(&["daemon-reload"]).0);
    let (ok, out) = systemctl(&["start", UNIT]);
    assert!(ok, "{out}\n{}", systemctl(&["status", UNIT]).1);

    let phases = || -> BTreeMap<String, (String, String, String)> {
        let Some((_, body)) = get(d.port, "/pods") else { return BTreeMap::new() };
        let pods: Value = serde_json::from_str(&body).unwrap_or_default();
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let s = &p["status"];
                (text(&p["metadata"]["name"]), (text(&s["phase"]), text(&s["reason"]), text(&s["message"])))
            })
            .collect()
    };
    wait_until(60, "the three pods running", || {
        let p = phases();
        p.len() == 3 && p.values().all(|(phase, _, _)| phase == "Running")
    });
    // The daemon holds logind's delay lock (taken once logind answers on the bus, which may come after the pods
    // run), and logind waits the whole period for it (raised from its 5 s).
    let inhibitors = || {
        let out = Command::new("systemd-inhibit").args(["--list", "--no-pager"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    wait_until(30, "the daemon holds logind's delay lock", || {
        inhibitors().lines().any(|l| l.contains("nodewarden") && l.contains("delay"))
    });
    let delay = Command::new("busctl")
        .args(["get-property", "org.freedesktop.login1", "/org/freedesktop/login1"])
        .args(["org.freedesktop.login1.Manager", "InhibitDelayMaxUSec"])
        .output()
        .unwrap();
    let delay = String::from_utf8_lossy(&delay.stdout).into_owned();
    let usec: u64 = delay.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(u128::from(usec) >= 3 * SHARE.as_micros(), "InhibitDelayMaxUSec not raised: {delay}");

    let (ok, out) = systemctl(&["poweroff", "--no-block"]);
    assert!(ok, "{out}");
    let t0 = Instant::now();
    let mut ended: BTreeMap<String, Duration> = BTreeMap::new();
    let mut shutting_down = false;
    // A pod that comes while the node shuts down is refused, as the kubelet refuses it.
    let mut late: Option<(String, String, String)> = None;
    let mut status_said = false;
    let show_status = || {
        let out = Command::new("systemctl").args(["show", "-P", "StatusText", UNIT]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    while (ended.len() < 3 || late.is_none()) && t0.elapsed() < Duration::from_secs(30) {
        // One time for everything one look at /pods finds.
        let (seen, now) = (phases(), t0.elapsed());
        for (name, (phase, reason, message)) in seen {
            if name == "late-vm" {
                if phase == "Failed" {
                    late = Some((phase, reason, message));
                }
            } else if phase == "Failed" && !ended.contains_key(&name) {
                assert_eq!(reason, "Terminated", "{name}");
                assert_eq!(message, "Pod was terminated in response to imminent node shutdown.", "{name}");
                ended.insert(name, now);
            }
        }
        let now_shutting_down =
            get(d.port, "/readyz?verbose").is_some_and(|(_, b)| b.contains("node is shutting down"));
        if now_shutting_down && !shutting_down {
            std::fs::write(manifests.join("late.yaml"), prioritized("late", "priority: 0", "exec sleep 100000"))
                .unwrap();
        }
        shutting_down |= now_shutting_down;
        // `systemctl status` says so too (the status line follows within a second).
        if shutting_down && !status_said {
            status_said = show_status().starts_with("Shutting down: ");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The shutdown goes on (systemd is stopping) once the daemon released its lock. This test's unit is not
    // stopped by the shutdown: the test runs on until the guest powers off.
    let released = nodewarden_testkit::poll(Duration::from_secs(30), Duration::from_millis(50), || {
        systemctl(&["is-system-running"]).1.trim() == "stopping"
    });
    let resumed = t0.elapsed();
    assert!(shutting_down, "/readyz never said the node is shutting down");
    let refused =
        ("Failed".to_owned(), "NodeShutdown".to_owned(), "Pod was rejected as the node is shutting down.".to_owned());
    assert_eq!(late, Some(refused), "the pod that came during the shutdown");
    let journal = Command::new("journalctl").args(["-u", UNIT, "--no-pager", "-o", "short-precise"]).output().unwrap();
    let journal = String::from_utf8_lossy(&journal.stdout).into_owned();
    let ended_and_log = format!("{ended:?}\n{journal}");
    assert!(status_said, "the status line never said the node is shutting down: {}", show_status());
    // This daemon runs the cgroupfs driver on a systemd host: it says that systemd owns the tree.
    assert!(journal.contains("systemd is the init system and owns the cgroup tree"), "{journal}");
    let ended = &ended;
    let at = |name: &str| ended.get(name).copied().unwrap_or_else(|| panic!("{name} was not terminated: {ended:?}"));
    let (low, mid, critical) = (at("low-vm"), at("mid-vm"), at("critical-vm"));
    // low and mid end when their shares are over (about 3 and 6 s after the poweroff), critical right after mid.
    assert!(low < mid && mid <= critical, "{ended_and_log}");
    assert!(low >= SHARE - Duration::from_millis(500) && low <= SHARE + Duration::from_secs(2), "{ended_and_log}");
    assert!(mid - low >= SHARE - Duration::from_millis(800), "{ended_and_log}");
    assert!(critical - mid < SHARE, "the critical pod stopped at SIGTERM: {ended_and_log}");
    // Released by the daemon, not by logind's timer (3 shares plus a second a group).
    assert!(released && resumed < 3 * SHARE, "the shutdown went on {resumed:?} after the poweroff: {ended_and_log}");

    // Passed: the status goes out before the guest powers off under us; then the timeline, if stderr still is.
    let mut f = std::fs::File::create(rc_file).unwrap();
    f.write_all(b"0\n").unwrap();
    f.sync_all().unwrap();
    let _ = writeln!(
        std::io::stderr(),
        "shutdown timeline from systemctl poweroff: {ended:?}; the shutdown went on after {resumed:?}"
    );
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}
