//! The daemon as a systemd service, under systemd as PID 1 (`NODEWARDEN_VM_INIT=systemd deploy/vm/run`; skipped
//! elsewhere): the unit of `deploy/` starts as `Type=notify` (systemctl returns once the daemon said `READY=1`),
//! its `STATUS=` line says what it does, a restart adopts the pods, and the watchdog restarts a daemon that stops
//! making progress.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
#![allow(clippy::disallowed_types)] // waits for real processes, in real time

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::*;

const UNIT: &str = "nodewarden-test.service";

/// True in the VM's systemd boot (`NODEWARDEN_VM_SYSTEMD` set, and systemd PID 1): the test installs, restarts
/// and stops units, which it must never do to the host's own systemd.
fn systemd_available() -> bool {
    if std::env::var_os("NODEWARDEN_VM_SYSTEMD").is_none() {
        eprintln!("skipped: not the VM's systemd boot (NODEWARDEN_VM_SYSTEMD)");
        return false;
    }
    let comm = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    assert_eq!(comm.trim(), "systemd", "NODEWARDEN_VM_SYSTEMD is set but PID 1 is not systemd");
    cgroup2_available()
}

fn systemctl(args: &[&str]) -> (bool, String) {
    let out = Command::new("systemctl").args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// `systemctl show` of the unit's properties.
fn show(props: &[&str]) -> BTreeMap<String, String> {
    let mut args = vec!["show", UNIT];
    for p in props {
        args.extend(["-p", p]);
    }
    let (_, out) = systemctl(&args);
    out.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

/// The unit of `deploy/`, pointed at the built binary and the test's config, with a short watchdog and abort
/// timeout for the test (a drop-in, as an operator would override it).
fn install_unit(config: &Path) {
    let shipped = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nodewarden.service"))
        .unwrap()
        .replace("/usr/local/bin/nodewarden", BIN)
        .replace("/etc/nodewarden/config.yaml", &config.display().to_string());
    std::fs::write(format!("/run/systemd/system/{UNIT}"), shipped).unwrap();
    let dropin = format!("/run/systemd/system/{UNIT}.d");
    std::fs::create_dir_all(&dropin).unwrap();
    std::fs::write(format!("{dropin}/test.conf"), "[Service]\nWatchdogSec=3s\nTimeoutAbortSec=2s\nRestartSec=1\n")
        .unwrap();
    let (ok, out) = systemctl(&["daemon-reload"]);
    assert!(ok, "{out}");
}

#[test]
fn the_unit_notifies_ready_restarts_adopt_and_the_watchdog_restarts_a_stalled_daemon() {
    if !systemd_available() {
        return;
    }
    let d = Daemon::new("systemd", "");
    let manifests = quiet_manifests(d.dir.path());
    let config = std::fs::read_to_string(d.config_path()).unwrap();
    std::fs::write(d.config_path(), format!("{config}staticPodPath: {}\n", manifests.display())).unwrap();
    install_unit(&d.config_path());

    // Type=notify: `systemctl start` returns once the daemon said READY=1, after its first pod sync and eviction
    // pass, so /readyz answers at once.
    let (ok, out) = systemctl(&["start", UNIT]);
    assert!(ok, "{out}\n{}", systemctl(&["status", UNIT]).1);
    assert_eq!(get(d.port, "/readyz").map(|(s, _)| s), Some(200), "READY=1 came before the daemon was ready");
    let s = show(&["ActiveState", "SubState", "Type", "WatchdogUSec", "NRestarts", "MainPID"]);
    assert_eq!(
        (s["ActiveState"].as_str(), s["SubState"].as_str(), s["Type"].as_str()),
        ("active", "running", "notify")
    );
    assert_eq!(s["WatchdogUSec"], "3s");
    wait_until(30, "the quiet pod running", || first_container(d.port).is_some());
    wait_until(10, "the status line", || show(&["StatusText"])["StatusText"].starts_with("Running: 1 pods running"));
    let pod = first_container(d.port);

    // `systemctl restart`: the pod keeps running and the new daemon adopts it.
    let first = s["MainPID"].clone();
    let (ok, out) = systemctl(&["restart", UNIT]);
    assert!(ok, "{out}");
    assert_ne!(show(&["MainPID"])["MainPID"], first);
    wait_until(30, "the pod adopted after systemctl restart", || first_container(d.port) == pod);

    // A stalled daemon (SIGSTOP) feeds no watchdog: systemd kills it after WatchdogSec and starts it again, and
    // the new one adopts the pod.
    let stalled = show(&["MainPID"])["MainPID"].clone();
    Command::new("kill").args(["-STOP", &stalled]).status().unwrap();
    wait_until(60, "systemd restarted the stalled daemon", || {
        let s = show(&["NRestarts", "MainPID", "ActiveState"]);
        s["NRestarts"] != "0" && s["MainPID"] != stalled && s["MainPID"] != "0" && s["ActiveState"] == "active"
    });
    let (_, journal) = {
        let out = Command::new("journalctl").args(["-u", UNIT, "--no-pager", "-o", "cat"]).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    assert!(journal.contains("Watchdog timeout"), "{journal}");
    wait_until(60, "ready again after the watchdog restart", || get(d.port, "/readyz").is_some_and(|(s, _)| s == 200));
    wait_until(30, "the pod adopted after the watchdog restart", || first_container(d.port) == pod);

    let (ok, out) = systemctl(&["stop", UNIT]);
    assert!(ok, "{out}");
    let _ = std::fs::remove_dir_all(format!("/run/systemd/system/{UNIT}.d"));
    let _ = std::fs::remove_file(format!("/run/systemd/system/{UNIT}"));
    // The pod outlived the daemon (KillMode=process); the test's daemon clean-up kills what is left.
    assert!(first_container(d.port).is_none(), "the daemon is stopped");
}
