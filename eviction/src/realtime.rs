//! The eviction thread's place in the scheduler. Under the normal scheduler a thread woken on a busy node may wait
//! for the running task's time slice to end (a scheduler tick, 4 ms on a 250 Hz kernel) before it runs; measured in
//! the VM with a hog and a Guaranteed stress-ng on both CPUs (six runs each), a pass that saw the crossing took 3.4
//! to 13.9 ms to send SIGTERM, 3.5 to 6.2 ms once the thread was under `SCHED_FIFO`. A real-time thread runs as soon
//! as it is woken, ahead of every normal task; work whose length has no bound runs under the normal scheduler
//! ([`with_normal_scheduler`]).

use std::io;

/// The highest `SCHED_FIFO` priority.
pub const MAX_REALTIME_PRIORITY: u8 = 99;

/// Puts the calling thread under `SCHED_FIFO` at `priority` (1 to [`MAX_REALTIME_PRIORITY`]), with
/// `SCHED_RESET_ON_FORK`: threads and processes it creates start under the normal scheduler. Needs
/// `CAP_SYS_NICE` (or an `RLIMIT_RTPRIO` that allows the priority); on a kernel with real-time group scheduling,
/// also real-time runtime for the thread's cgroup.
pub fn make_realtime(priority: u8) -> io::Result<()> {
    if priority == 0 || priority > MAX_REALTIME_PRIORITY {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("SCHED_FIFO priority {priority}")));
    }
    let param = libc::sched_param { sched_priority: libc::c_int::from(priority) };
    // SAFETY: `param` is a valid `sched_param` that outlives the call, and pid 0 names the calling thread; the call
    // reads `param` and changes nothing else of this process.
    #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &raw const param) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Runs `f` with the calling thread under the normal scheduler, and puts it back under `SCHED_FIFO` at its priority
/// after: for work whose length has no bound (the reclaim of node storage on disk pressure), which must not hold a CPU
/// ahead of every normal task. A thread not under `SCHED_FIFO` just runs `f`.
pub fn with_normal_scheduler<T>(f: impl FnOnce() -> T) -> T {
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; the calls read its policy and write `param`, a valid `sched_param`.
    #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
    let fifo = unsafe { libc::sched_getscheduler(0) } & !libc::SCHED_RESET_ON_FORK == libc::SCHED_FIFO
        && unsafe { libc::sched_getparam(0, &raw mut param) } == 0;
    if !fifo {
        return f();
    }
    let normal = libc::sched_param { sched_priority: 0 };
    // SAFETY: as in `make_realtime`.
    #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
    let lowered =
        unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER | libc::SCHED_RESET_ON_FORK, &raw const normal) };
    let out = f();
    if lowered == 0 {
        let back = u8::try_from(param.sched_priority).ok().map(make_realtime);
        if let Some(Err(e)) = back {
            tracing::warn!(error = %e, "cannot put the eviction thread back under SCHED_FIFO");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_priorities_are_refused_before_any_call() {
        for p in [0, 100, u8::MAX] {
            assert_eq!(make_realtime(p).unwrap_err().kind(), io::ErrorKind::InvalidInput, "{p}");
        }
    }

    #[test]
    fn a_thread_made_realtime_runs_under_sched_fifo_and_its_threads_do_not() {
        let run = std::thread::spawn(|| {
            if let Err(e) = make_realtime(1) {
                // Only with CAP_SYS_NICE (a container's root may lack it); the VM test of the daemon is strict.
                assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
                return None;
            }
            // SAFETY: pid 0 is the calling thread; the calls only read its policy.
            #[expect(
                unsafe_code,
                reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound"
            )]
            let own = unsafe { libc::sched_getscheduler(0) };
            #[expect(
                unsafe_code,
                reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound"
            )]
            let child = std::thread::spawn(|| unsafe { libc::sched_getscheduler(0) }).join().ok();
            #[expect(
                unsafe_code,
                reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound"
            )]
            let inside = with_normal_scheduler(|| unsafe { libc::sched_getscheduler(0) });
            #[expect(
                unsafe_code,
                reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound"
            )]
            let after = unsafe { libc::sched_getscheduler(0) };
            Some((own, child, inside, after))
        });
        if let Some((own, child, inside, after)) = run.join().unwrap() {
            assert_eq!(own & !libc::SCHED_RESET_ON_FORK, libc::SCHED_FIFO);
            assert_eq!(child, Some(libc::SCHED_OTHER));
            assert_eq!(inside & !libc::SCHED_RESET_ON_FORK, libc::SCHED_OTHER);
            assert_eq!(after & !libc::SCHED_RESET_ON_FORK, libc::SCHED_FIFO);
        }
    }
}
