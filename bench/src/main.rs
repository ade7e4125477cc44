//! Benchmarks of nodewarden against its peers (the kernel OOM killer alone, earlyoom, a kubelet-like
//! configuration), driven by stress-ng inside the test VM of `deploy/vm`.
//!
//! The scenarios arrive with the eviction manager; until then this binary only says so.

fn main() {
    println!("nodewarden-bench: no scenarios yet (they arrive with the eviction manager)");
}
