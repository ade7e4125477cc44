//! The transitions of [`step`], as a table of (state, input) → (state, actions), without tokio.

use std::time::Duration;

use jiff::Timestamp;
use tokio::time::Instant;

use super::step;
use crate::events::Happened;
use crate::status::{PodPhase, RestartPolicy, Terminal};
use crate::worker::lifecycle::{
    Action, ContainerSlot, ContainerState, Input, KILL_WAIT, LastExit, Lifecycle, MAX_GRACE, PlaceFailure, PodState,
    PrepareStep, Readiness, Reason, Resume, Role, Stage, StartedContainer, grace_period,
};
use nodewarden_runtime::ExitInfo;

const GRACE: Duration = Duration::from_secs(30);

fn exit(code: i32) -> ExitInfo {
    ExitInfo::at_epoch(code)
}

fn slot(name: &str, role: Role, state: ContainerState) -> ContainerSlot {
    ContainerSlot { state, ..ContainerSlot::new(name, role) }
}

fn running(id: &str, now: Instant) -> ContainerState {
    let started = StartedContainer {
        id: id.into(),
        pid: 1,
        pid_start: None,
        started_at: Timestamp::UNIX_EPOCH,
        probes: Vec::new(),
    };
    ContainerState::Running(started.running(now))
}

fn pod(state: PodState, containers: Vec<ContainerSlot>) -> Lifecycle {
    Lifecycle {
        state,
        containers,
        policy: RestartPolicy::Always,
        grace: GRACE,
        start_time: None,
        retry: None,
        unlisted: false,
    }
}

/// The pod as its source no longer lists it.
fn unlisted(mut p: Lifecycle) -> Lifecycle {
    p.unlisted = true;
    p
}

fn never(mut p: Lifecycle) -> Lifecycle {
    p.policy = RestartPolicy::Never;
    p
}

fn terminate(grace: u64, reason: Reason) -> Input {
    Input::Terminate { grace: Duration::from_secs(grace), reason }
}

fn evicted() -> Reason {
    Reason::Evicted { message: "low on memory".into(), disruption: true }
}

fn terminating(reason: Reason, deadline: Instant, stage: Stage) -> PodState {
    PodState::Terminating { reason, deadline, stage }
}

#[test]
fn transitions() {
    let now = Instant::now();
    let secs = |s| now + Duration::from_secs(s);
    let app = |state| slot("app", Role::App, state);
    let init = |state| slot("init", Role::Init, state);
    let preparing = PodState::Preparing { step: PrepareStep::Sandbox, then: Resume::Initializing };
    let stopping = |reason| terminating(reason, secs(10), Stage::Stopping);
    let failed_init = Terminal::failed(None, Some("init container init failed with exit code 3".into()));
    let cases: Vec<(&str, Lifecycle, Input, PodState, Vec<Action>)> = vec![
        (
            "a deleted pod waiting for its name, still listed, is finalized at once",
            pod(PodState::AwaitingName, vec![app(ContainerState::Pending)]),
            terminate(5, Reason::Deleted),
            PodState::Finalizing,
            vec![Action::ReleaseName, Action::Finalize],
        ),
        (
            "a deleted pod waiting for its name that its source dropped is finalized and forgotten",
            unlisted(pod(PodState::AwaitingName, vec![app(ContainerState::Pending)])),
            terminate(5, Reason::Deleted),
            PodState::Removed,
            vec![Action::ReleaseName, Action::Finalize, Action::Forget],
        ),
        (
            "an evicted pod that was never placed fails at once",
            pod(PodState::Admitting, vec![app(ContainerState::Pending)]),
            terminate(5, evicted()),
            PodState::Finished(Terminal::evicted("low on memory".into())),
            vec![Action::ReleaseName],
        ),
        (
            "terminating while the sandbox is made drops the call and cleans up",
            pod(preparing.clone(), vec![app(ContainerState::Pending)]),
            terminate(10, Reason::Deleted),
            terminating(Reason::Deleted, secs(10), Stage::CleaningUp),
            vec![
                Action::Abandon,
                Action::MarkTerminating,
                Action::Save,
                Action::CleanUp { deleted: true, keep_containers: false },
            ],
        ),
        (
            "terminating while an init container runs stops it",
            pod(PodState::Initializing, vec![init(running("c1", now)), app(ContainerState::Pending)]),
            terminate(10, evicted()),
            stopping(evicted()),
            vec![
                Action::Abandon,
                Action::Record(Happened::Killing { index: 0, probe: None }),
                Action::StopAll { ids: vec!["c1".into()], deadline: secs(10) },
                Action::MarkTerminating,
            ],
        ),
        (
            "terminating during an image pull drops the pull and stops what runs",
            pod(PodState::Running, vec![app(ContainerState::Starting), slot("b", Role::App, running("c2", now))]),
            terminate(10, Reason::Deleted),
            stopping(Reason::Deleted),
            // The deletion's deadline is saved for a daemon restarted meanwhile.
            vec![
                Action::Abandon,
                Action::Record(Happened::Killing { index: 1, probe: None }),
                Action::StopAll { ids: vec!["c2".into()], deadline: secs(10) },
                Action::MarkTerminating,
                Action::Save,
            ],
        ),
        (
            "a shorter grace period brings the deadline forward",
            pod(stopping(evicted()), vec![app(running("c1", now))]),
            terminate(3, evicted()),
            terminating(evicted(), secs(3), Stage::Stopping),
            vec![],
        ),
        (
            "a longer grace period never extends it",
            pod(stopping(evicted()), vec![app(running("c1", now))]),
            terminate(60, evicted()),
            stopping(evicted()),
            vec![],
        ),
        (
            "a zero grace period kills at once",
            pod(stopping(evicted()), vec![app(running("c1", now))]),
            terminate(0, evicted()),
            terminating(evicted(), now, Stage::Killing { until: now + KILL_WAIT }),
            vec![Action::KillAll { ids: vec!["c1".into()] }],
        ),
        (
            "a deletion wins over an eviction, and is saved",
            pod(stopping(evicted()), vec![app(running("c1", now))]),
            terminate(60, Reason::Deleted),
            stopping(Reason::Deleted),
            vec![Action::Save],
        ),
        (
            "a deletion's deadline brought forward is saved",
            pod(stopping(Reason::Deleted), vec![app(running("c1", now))]),
            terminate(3, Reason::Deleted),
            terminating(Reason::Deleted, secs(3), Stage::Stopping),
            vec![Action::Save],
        ),
        (
            "a spec update while terminating is ignored",
            pod(stopping(Reason::Deleted), vec![app(running("c1", now))]),
            Input::SpecUpdate { grace: Duration::from_secs(1), redefined: vec![0] },
            stopping(Reason::Deleted),
            vec![],
        ),
        (
            "a spec update of a running pod updates its resources",
            pod(PodState::Running, vec![app(running("c1", now))]),
            Input::SpecUpdate { grace: GRACE, redefined: vec![] },
            PodState::Running,
            vec![Action::UpdateResources],
        ),
        (
            "the deadline passes: cgroup.kill",
            pod(terminating(Reason::Deleted, now, Stage::Stopping), vec![app(running("c1", now))]),
            Input::Timer,
            terminating(Reason::Deleted, now, Stage::Killing { until: now + KILL_WAIT }),
            vec![Action::KillAll { ids: vec!["c1".into()] }],
        ),
        (
            "the last exit while stopping: clean up",
            pod(stopping(evicted()), vec![app(running("c1", now))]),
            Input::ContainerExited { id: "c1".into(), info: exit(143) },
            terminating(evicted(), secs(10), Stage::CleaningUp),
            vec![
                Action::RetireContainer { index: 0, id: "c1".into(), created: Timestamp::UNIX_EPOCH },
                Action::Save,
                Action::CleanUp { deleted: false, keep_containers: false },
            ],
        ),
        (
            "an evicted pod is kept once cleaned up",
            pod(terminating(evicted(), secs(10), Stage::CleaningUp), vec![app(ContainerState::Exited)]),
            Input::CleanedUp,
            PodState::Finished(Terminal::evicted("low on memory".into())),
            vec![Action::Save, Action::ReleaseName],
        ),
        (
            "a deleted pod still listed is finalized once cleaned up, what ran ended",
            pod(terminating(Reason::Deleted, secs(10), Stage::CleaningUp), vec![app(running("c1", now))]),
            Input::CleanedUp,
            PodState::Finalizing,
            vec![Action::ReleaseName, Action::Finalize],
        ),
        (
            "a deleted pod its source dropped is finalized and forgotten once cleaned up",
            unlisted(pod(terminating(Reason::Deleted, secs(10), Stage::CleaningUp), vec![app(ContainerState::Exited)])),
            Input::CleanedUp,
            PodState::Removed,
            vec![Action::ReleaseName, Action::Finalize, Action::Forget],
        ),
        (
            "a finalizing pod is forgotten once its source drops it",
            pod(PodState::Finalizing, vec![app(ContainerState::Exited)]),
            Input::Unlisted,
            PodState::Removed,
            vec![Action::Forget],
        ),
        (
            "a finalizing pod stays through a termination",
            pod(PodState::Finalizing, vec![app(ContainerState::Exited)]),
            terminate(0, evicted()),
            PodState::Finalizing,
            vec![],
        ),
        (
            "a running pod its source dropped is only marked: the deletion that comes with it terminates it",
            pod(PodState::Running, vec![app(running("c1", now))]),
            Input::Unlisted,
            PodState::Running,
            vec![],
        ),
        (
            "a finished pod that is deleted is cleaned up again, its logs too",
            pod(PodState::Finished(failed_init.clone()), vec![app(ContainerState::Exited)]),
            terminate(10, Reason::Deleted),
            terminating(Reason::Deleted, secs(10), Stage::CleaningUp),
            vec![Action::CleanUp { deleted: true, keep_containers: false }],
        ),
        (
            "a failed init container fails a Never pod",
            never(pod(PodState::Initializing, vec![init(running("c1", now)), app(ContainerState::Pending)])),
            Input::ContainerExited { id: "c1".into(), info: exit(3) },
            terminating(Reason::Completed(failed_init.clone()), secs(30), Stage::CleaningUp),
            vec![
                Action::RetireContainer { index: 0, id: "c1".into(), created: Timestamp::UNIX_EPOCH },
                Action::Save,
                Action::MarkTerminating,
                Action::CleanUp { deleted: false, keep_containers: true },
            ],
        ),
        (
            "a completed init container lets the app start",
            never(pod(PodState::Initializing, vec![init(running("c1", now)), app(ContainerState::Pending)])),
            Input::ContainerExited { id: "c1".into(), info: exit(0) },
            PodState::Running,
            vec![
                Action::RetireContainer { index: 0, id: "c1".into(), created: Timestamp::UNIX_EPOCH },
                Action::Save,
                Action::StartContainer { index: 1, attempt: 0 },
            ],
        ),
        (
            "the first restart of an app container is immediate",
            pod(PodState::Running, vec![app(running("c1", now))]),
            Input::ContainerExited { id: "c1".into(), info: exit(1) },
            PodState::Running,
            vec![
                Action::RetireContainer { index: 0, id: "c1".into(), created: Timestamp::UNIX_EPOCH },
                Action::Save,
                Action::StartContainer { index: 0, attempt: 1 },
            ],
        ),
        (
            "an admission refusal fails the pod",
            pod(PodState::Admitting, vec![app(ContainerState::Pending)]),
            Input::Placed(Err(PlaceFailure::Refused { reason: "OutOfmemory".into(), message: "no".into() })),
            PodState::Finished(Terminal::failed(Some("OutOfmemory".into()), Some("no".into()))),
            vec![
                Action::Record(Happened::Refused { reason: "OutOfmemory".into(), message: "no".into() }),
                Action::ReleaseName,
            ],
        ),
        (
            "a start that was dropped by a termination is ignored when it returns",
            pod(
                stopping(Reason::Deleted),
                vec![app(ContainerState::Pending), slot("b", Role::App, running("c2", now))],
            ),
            Input::ContainerStarted {
                index: 0,
                attempt: 0,
                result: Ok(StartedContainer {
                    id: "c3".into(),
                    pid: 3,
                    pid_start: None,
                    started_at: Timestamp::UNIX_EPOCH,
                    probes: vec![],
                }),
            },
            stopping(Reason::Deleted),
            vec![],
        ),
        (
            "a container started: every app runs, saved, then reported",
            pod(PodState::Running, vec![app(ContainerState::Starting)]),
            Input::ContainerStarted {
                index: 0,
                attempt: 0,
                result: Ok(StartedContainer {
                    id: "c1".into(),
                    pid: 1,
                    pid_start: None,
                    started_at: Timestamp::UNIX_EPOCH,
                    probes: vec![],
                }),
            },
            PodState::Running,
            vec![
                Action::Record(Happened::Created(0)),
                Action::Record(Happened::Started(0)),
                Action::Save,
                Action::ReportStarted,
            ],
        ),
        (
            "the sandbox is made: init containers start",
            pod(preparing, vec![init(ContainerState::Pending), app(ContainerState::Pending)]),
            Input::SandboxReady(Ok(())),
            PodState::Initializing,
            vec![Action::StartContainer { index: 0, attempt: 0 }],
        ),
    ];
    for (what, before, input, want_state, want_actions) in cases {
        let (after, actions) = step(before, input, now);
        assert_eq!(after.state, want_state, "{what}");
        assert_eq!(actions, want_actions, "{what}");
    }
}

#[test]
fn a_start_during_termination_is_pending_again() {
    let now = Instant::now();
    let p = pod(PodState::Running, vec![slot("app", Role::App, ContainerState::Starting)]);
    let (p, _) = step(p, terminate(5, Reason::Deleted), now);
    assert_eq!(p.containers[0].state, ContainerState::Pending);
}

#[test]
fn a_failing_liveness_probe_stops_the_container_once() {
    let now = Instant::now();
    let cfg = crate::probe::ProbeConfig {
        action: crate::probe::Action::Exec(vec!["alive".into()]),
        initial_delay: Duration::ZERO,
        period: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        success_threshold: 1,
        failure_threshold: 1,
    };
    let started = StartedContainer {
        id: "c1".into(),
        pid: 1,
        pid_start: None,
        started_at: Timestamp::UNIX_EPOCH,
        probes: vec![(crate::probe::ProbeKind::Liveness, cfg)],
    };
    let p = pod(PodState::Running, vec![slot("app", Role::App, ContainerState::Running(started.running(now)))]);
    let probe =
        |ok| Input::ProbeResult { id: "c1".into(), kind: crate::probe::ProbeKind::Liveness, ok, output: "dead".into() };
    let (p, actions) = step(p, probe(false), now);
    let liveness = crate::probe::ProbeKind::Liveness;
    assert_eq!(
        actions,
        [
            Action::Record(Happened::Unhealthy { index: 0, kind: liveness, output: "dead".into() }),
            Action::Record(Happened::Killing { index: 0, probe: Some(liveness) }),
            Action::StopContainer { id: "c1".into(), grace: GRACE, why: "dead".into() },
        ]
    );
    assert_eq!(p.containers[0].running().map(|r| r.readiness), Some(Readiness::Stopping));
    let (_, actions) = step(p, probe(true), now);
    assert_eq!(actions, [], "a stopping container is not stopped again");
}

#[test]
fn a_grace_period_near_i64_max_does_not_overflow() {
    let now = Instant::now();
    let manifest = serde_json::json!({"metadata": {"name": "p", "uid": "u"},
        "spec": {"terminationGracePeriodSeconds": i64::MAX, "containers": [{"name": "app"}]}});
    let manifest: k8s_openapi::api::core::v1::Pod = serde_json::from_value(manifest).unwrap();
    assert_eq!(grace_period(&manifest), MAX_GRACE);
    let mut p = Lifecycle::new(&manifest);
    p.state = PodState::Running;
    p.containers[0].state = running("c1", now);
    let (p, actions) = step(p, Input::Terminate { grace: grace_period(&manifest), reason: Reason::Deleted }, now);
    assert_eq!(p.state, terminating(Reason::Deleted, now + MAX_GRACE, Stage::Stopping));
    assert!(actions.contains(&Action::StopAll { ids: vec!["c1".into()], deadline: now + MAX_GRACE }), "{actions:?}");
    // An eviction's grace period is cut the same way.
    let (p, _) = step(p, Input::Terminate { grace: Duration::MAX, reason: evicted() }, now);
    assert_eq!(p.state, terminating(Reason::Deleted, now + MAX_GRACE, Stage::Stopping));
}

#[test]
fn a_restart_count_at_u32_max_saturates() {
    let now = Instant::now();
    let mut app = slot("app", Role::App, ContainerState::BackOff { until: now });
    app.restarts = u32::MAX;
    app.last_exit = Some(LastExit { info: exit(1), container_id: Some("c1".into()) });
    let (p, actions) = step(pod(PodState::Running, vec![app]), Input::Timer, now);
    assert_eq!(actions, [Action::StartContainer { index: 0, attempt: u32::MAX }]);
    let started = started_container("c2", 2);
    let (p, _) = step(p, Input::ContainerStarted { index: 0, attempt: u32::MAX, result: Ok(started) }, now);
    assert_eq!(p.containers[0].restarts, u32::MAX);
    assert!(p.containers[0].running().is_some());
}

#[test]
fn all_app_containers_done_ends_the_pod() {
    let now = Instant::now();
    let p = never(pod(PodState::Running, vec![slot("app", Role::App, running("c1", now))]));
    let (p, _) = step(p, Input::ContainerExited { id: "c1".into(), info: exit(0) }, now);
    let done = Terminal::ended(PodPhase::Succeeded);
    assert_eq!(p.state, terminating(Reason::Completed(done.clone()), now + GRACE, Stage::CleaningUp));
    let (p, _) = step(p, Input::CleanedUp, now);
    assert_eq!(p.state, PodState::Finished(done));
}

#[test]
fn a_pod_waiting_for_a_new_sandbox_restarts_its_containers_once_it_has_one() {
    let now = Instant::now();
    let preparing = PodState::Preparing { step: PrepareStep::Sandbox, then: Resume::Running };
    let p = pod(preparing.clone(), vec![slot("app", Role::App, running("c1", now))]);
    let (p, actions) = step(p, Input::ContainerExited { id: "c1".into(), info: exit(137) }, now);
    assert_eq!(
        (&p.state, actions),
        (
            &preparing,
            vec![Action::RetireContainer { index: 0, id: "c1".into(), created: Timestamp::UNIX_EPOCH }, Action::Save]
        )
    );
    assert_eq!(p.containers[0].state, ContainerState::BackOff { until: now });
    let (p, actions) = step(p, Input::SandboxReady(Ok(())), now);
    assert_eq!(p.state, PodState::Running);
    assert_eq!(actions, [Action::StartContainer { index: 0, attempt: 1 }]);
}

#[test]
fn a_failed_step_is_retried_once_when_due_with_a_doubling_wait() {
    let now = Instant::now();
    let preparing = PodState::Preparing { step: PrepareStep::Sandbox, then: Resume::Initializing };
    let p = pod(preparing.clone(), vec![slot("app", Role::App, ContainerState::Pending)]);
    let (p, actions) = step(p, Input::SandboxReady(Err("no".into())), now);
    let failed = vec![Action::Record(Happened::FailedSandbox("no".into()))];
    assert_eq!((p.next_wakeup(), actions), (Some(now + Duration::from_secs(1)), failed));
    let later = now + Duration::from_secs(1);
    let (p, actions) = step(p, Input::Timer, later);
    assert_eq!(actions, [Action::RunSandbox]);
    assert_eq!(p.next_wakeup(), None, "no second call while the first is under way");
    let (p, actions) = step(p, Input::Timer, later);
    assert_eq!(actions, []);
    let (p, _) = step(p, Input::SandboxReady(Err("no".into())), later);
    assert_eq!(p.next_wakeup(), Some(later + Duration::from_secs(2)));
    assert_eq!(p.retry.as_ref().map(|r| r.message.as_str()), Some("cannot create the pod sandbox: no"));
    let (p, actions) = step(p, Input::SandboxReady(Ok(())), later);
    assert_eq!((p.state, p.retry), (PodState::Running, None), "no init containers: straight to running");
    assert_eq!(actions, [Action::StartContainer { index: 0, attempt: 0 }]);
}

/// A finalizing pod has nothing left to do but wait for its source to drop it.
#[test]
fn a_finalizing_pod_only_waits_to_be_dropped() {
    let now = Instant::now();
    let mut p = pod(PodState::Finalizing, vec![slot("app", Role::App, ContainerState::Exited)]);
    let inputs = [
        terminate(0, Reason::Deleted),
        terminate(0, Reason::Shutdown),
        Input::SpecUpdate { grace: Duration::from_secs(1), redefined: vec![0] },
        Input::Timer,
        Input::CleanedUp,
        Input::NameFree,
        Input::ContainerExited { id: "c1".into(), info: exit(0) },
    ];
    for input in inputs {
        let what = format!("{input:?}");
        let (next, actions) = step(p, input, now);
        assert_eq!((&next.state, actions.as_slice()), (&PodState::Finalizing, &[][..]), "{what}");
        p = next;
    }
    assert_eq!(p.next_wakeup(), None);
    let (p, actions) = step(p, Input::Unlisted, now);
    assert_eq!((p.state, actions), (PodState::Removed, vec![Action::Forget]));
}

/// A pod that completes while a sidecar's restart is under way drops that start, as a termination does: the sidecar
/// is not left to come up in a pod that is over (where no stop signal would reach it).
#[test]
fn a_pod_that_completes_drops_a_start_under_way() {
    let now = Instant::now();
    let p = never(pod(
        PodState::Running,
        vec![slot("sidecar", Role::Sidecar, ContainerState::Starting), slot("app", Role::App, running("c1", now))],
    ));
    let (p, actions) = step(p, Input::ContainerExited { id: "c1".into(), info: exit(0) }, now);
    assert!(p.state.is_over(), "{:?}", p.state);
    assert!(actions.contains(&Action::Abandon), "{actions:?}");
    assert_eq!(p.containers[0].state, ContainerState::Pending);
    let started = started_container("c2", 2);
    let (p2, actions) = step(p.clone(), Input::ContainerStarted { index: 0, attempt: 1, result: Ok(started) }, now);
    assert_eq!((p2.state, actions), (p.state, vec![]), "a late start result is ignored");
}

/// A container the runtime reports started, without probes.
fn started_container(id: &str, pid: u32) -> StartedContainer {
    StartedContainer { id: id.into(), pid, pid_start: None, started_at: Timestamp::UNIX_EPOCH, probes: vec![] }
}

#[test]
fn a_deletions_deadline_is_saved_as_a_time() {
    let now = Instant::now();
    let wall = Timestamp::from_second(1_000_000).unwrap();
    let deleting = terminating(Reason::Deleted, now + Duration::from_secs(90), Stage::Stopping);
    let saved = super::super::adopt::saved(&pod(deleting, vec![]), (now, wall));
    assert_eq!(saved.deletion_deadline, Some(Timestamp::from_second(1_000_090).unwrap()));
    let evicting = terminating(evicted(), now + Duration::from_secs(90), Stage::Stopping);
    assert_eq!(super::super::adopt::saved(&pod(evicting, vec![]), (now, wall)).deletion_deadline, None);
}

/// A container whose definition changed (a new image) is stopped and started again at once with it, even under
/// `restartPolicy: Never`; one waiting out its back-off starts now; one that exited for good stays so.
#[test]
fn a_redefined_container_is_restarted_with_its_new_spec() {
    let now = Instant::now();
    let later = now + Duration::from_secs(1);
    let p = never(pod(
        PodState::Running,
        vec![
            slot("app", Role::App, running("c1", now)),
            slot("waits", Role::App, ContainerState::BackOff { until: now + Duration::from_secs(40) }),
            slot("done", Role::App, ContainerState::Exited),
        ],
    ));
    let (p, actions) = step(p, Input::SpecUpdate { grace: GRACE, redefined: vec![0, 1, 2] }, now);
    assert_eq!(
        actions[..3],
        [
            Action::UpdateResources,
            Action::Record(Happened::Redefined(0)),
            Action::StopContainer { id: "c1".into(), grace: GRACE, why: "its definition changed".into() },
        ],
        "{actions:?}"
    );
    assert_eq!(p.containers[1].state, ContainerState::BackOff { until: now }, "its old back-off no longer counts");
    assert_eq!(p.containers[2].state, ContainerState::Exited);
    // A second update while it stops stops nothing more.
    let (p, actions) = step(p, Input::SpecUpdate { grace: GRACE, redefined: vec![0] }, now);
    assert_eq!(actions, [Action::UpdateResources]);
    // It exits (SIGTERM): under Never it starts again at once, without a back-off, as its next run.
    let (p, actions) = step(p, Input::ContainerExited { id: "c1".into(), info: exit(143) }, later);
    assert!(actions.contains(&Action::StartContainer { index: 0, attempt: 1 }), "{actions:?}");
    assert!(!actions.iter().any(|a| matches!(a, Action::Record(Happened::BackOff(_)))), "{actions:?}");
    assert_eq!(p.containers[0].state, ContainerState::Starting);
    assert!(!p.containers[0].redefined);
    // Exited again by itself: Never holds once more.
    let started = StartedContainer {
        id: "c2".into(),
        pid: 2,
        pid_start: None,
        started_at: Timestamp::UNIX_EPOCH,
        probes: Vec::new(),
    };
    let (p, _) = step(p, Input::ContainerStarted { index: 0, attempt: 1, result: Ok(started) }, later);
    let (p, _) = step(p, Input::ContainerExited { id: "c2".into(), info: exit(0) }, later);
    assert_eq!(p.containers[0].state, ContainerState::Exited);
}
