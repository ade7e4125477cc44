//! Restoring a pod an earlier daemon ran, as a table: what was saved and what the runtime still had → where the
//! pod carries on, each container's state, and the actions.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use tokio::time::Instant;

use super::ENDED_UNSEEN;
use crate::state::{SavedContainer, SavedPod};
use crate::status::{PodPhase, RestartPolicy, Terminal};
use crate::worker::lifecycle::{
    Action, ContainerSlot, ContainerState, Found, Input, Lifecycle, PodState, PrepareStep, Reason, Resume, Role, Stage,
    StartedContainer,
};
use crate::worker::step::step;
use nodewarden_runtime::ExitInfo;

const AT: Timestamp = Timestamp::constant(1_000, 0);
const STARTED: Timestamp = Timestamp::constant(900, 0);

fn lifecycle(policy: RestartPolicy, containers: &[(&str, Role)]) -> Lifecycle {
    Lifecycle {
        state: PodState::AwaitingName,
        containers: containers.iter().map(|(n, r)| ContainerSlot::new(*n, *r)).collect(),
        policy,
        grace: Duration::from_secs(30),
        start_time: None,
        retry: None,
        unlisted: false,
    }
}

/// A container the earlier daemon saved: its restarts, its main process while it ran, its last exit code.
fn saved(restarts: u32, pid: Option<u32>, last: Option<i32>) -> SavedContainer {
    SavedContainer {
        restarts,
        pid,
        pid_start: None,
        started_at: pid.map(|_| STARTED),
        last: last.map(ExitInfo::at_epoch),
        id: None,
        last_id: None,
    }
}

fn found(containers: &[(&str, SavedContainer)], sandbox: bool, running: &[usize]) -> Found {
    let adopted = |i: usize| StartedContainer {
        id: format!("c{i}").into(),
        pid: 10,
        pid_start: None,
        started_at: Timestamp::UNIX_EPOCH,
        probes: Vec::new(),
    };
    Found {
        saved: SavedPod {
            containers: containers.iter().map(|(n, s)| ((*n).to_owned(), s.clone())).collect(),
            start_time: Some(STARTED),
            ..SavedPod::default()
        },
        sandbox,
        running: running.iter().map(|i| (*i, adopted(*i))).collect::<BTreeMap<_, _>>(),
        at: AT,
    }
}

/// Each container as `name state restarts last-reason`.
fn containers(p: &Lifecycle) -> Vec<String> {
    p.containers
        .iter()
        .map(|c| {
            let state = match &c.state {
                ContainerState::Running(r) => format!("running({}@{})", r.id, r.started_at.as_second()),
                ContainerState::Pending => "pending".into(),
                ContainerState::Starting => "starting".into(),
                ContainerState::Exited => "exited".into(),
                other => format!("{other:?}"),
            };
            let last =
                c.last_exit.as_ref().map_or("-".to_owned(), |l| format!("{}:{}", l.info.reason, l.info.exit_code));
            format!("{} {state} {} {last}", c.name, c.restarts)
        })
        .collect()
}

struct Row {
    what: &'static str,
    before: Lifecycle,
    found: Found,
    state: PodState,
    containers: &'static [&'static str],
    actions: Vec<Action>,
}

#[test]
fn restore_table() {
    use RestartPolicy::{Always, Never};
    use Role::{App, Init, Sidecar};
    let now = Instant::now();
    let over = Terminal::failed(Some("Evicted".into()), Some("low on memory".into()));
    let unseen_failed = Terminal::ended(PodPhase::Failed);
    let rows = vec![
        Row {
            what: "an evicted pod stays over, nothing of it runs, and nothing of it is kept",
            before: lifecycle(Always, &[("app", App)]),
            found: Found {
                saved: SavedPod {
                    terminal: Some(over.clone()),
                    ..found(
                        &[("app", SavedContainer { last_id: Some("c1".into()), ..saved(0, None, Some(1)) })],
                        false,
                        &[],
                    )
                    .saved
                },
                ..found(&[], false, &[])
            },
            state: PodState::Finished(over.clone()),
            containers: &["app pending 0 -"],
            actions: vec![Action::ReleaseName],
        },
        Row {
            what: "a pod that ended on its own keeps its last exited containers, and nothing of it runs",
            before: lifecycle(Never, &[("init", Init), ("app", App)]),
            found: Found {
                saved: SavedPod {
                    terminal: Some(Terminal::ended(PodPhase::Succeeded)),
                    ..found(
                        &[
                            ("init", SavedContainer { last_id: Some("c1".into()), ..saved(0, None, Some(0)) }),
                            ("app", SavedContainer { last_id: Some("c2".into()), ..saved(0, None, Some(0)) }),
                        ],
                        false,
                        &[],
                    )
                    .saved
                },
                ..found(&[], false, &[])
            },
            state: PodState::Finished(Terminal::ended(PodPhase::Succeeded)),
            containers: &["init pending 0 -", "app pending 0 -"],
            actions: vec![
                Action::RetireContainer { index: 0, id: "c1".into(), created: Timestamp::UNIX_EPOCH },
                Action::RetireContainer { index: 1, id: "c2".into(), created: Timestamp::UNIX_EPOCH },
                Action::ReleaseName,
            ],
        },
        Row {
            what: "a running app container is adopted with its saved start time and restarts",
            before: lifecycle(Always, &[("app", App)]),
            found: found(&[("app", saved(2, Some(7), Some(1)))], true, &[0]),
            state: PodState::Running,
            containers: &["app running(c0@900) 2 Error:1"],
            actions: vec![Action::Save],
        },
        Row {
            what: "an app container that ended unseen is restarted under Always, as its next run",
            before: lifecycle(Always, &[("app", App)]),
            found: found(&[("app", saved(2, Some(7), None))], true, &[]),
            state: PodState::Running,
            containers: &["app starting 2 ContainerStatusUnknown:137"],
            actions: vec![Action::Save, Action::StartContainer { index: 0, attempt: 3 }],
        },
        Row {
            what: "the dead container kept, and the one that ended unseen, are retired again, oldest first",
            before: lifecycle(Always, &[("app", App)]),
            found: found(
                &[(
                    "app",
                    SavedContainer { id: Some("c9".into()), last_id: Some("c8".into()), ..saved(2, Some(7), Some(1)) },
                )],
                true,
                &[],
            ),
            state: PodState::Running,
            containers: &["app starting 2 ContainerStatusUnknown:137"],
            actions: vec![
                Action::RetireContainer { index: 0, id: "c8".into(), created: Timestamp::UNIX_EPOCH },
                Action::RetireContainer { index: 0, id: "c9".into(), created: STARTED },
                Action::Save,
                Action::StartContainer { index: 0, attempt: 3 },
            ],
        },
        Row {
            what: "under Never, the app container that ended unseen ends the pod Failed",
            before: lifecycle(Never, &[("app", App)]),
            found: found(&[("app", saved(0, Some(7), None))], true, &[]),
            state: PodState::Terminating {
                reason: Reason::Completed(unseen_failed),
                deadline: now + Duration::from_secs(30),
                stage: Stage::CleaningUp,
            },
            containers: &["app exited 0 ContainerStatusUnknown:137"],
            actions: vec![
                Action::Save,
                Action::MarkTerminating,
                Action::CleanUp { deleted: false, keep_containers: true },
            ],
        },
        Row {
            what: "an init container that completed is not run again: the app container starts",
            before: lifecycle(Always, &[("init", Init), ("app", App)]),
            found: found(&[("init", saved(0, None, Some(0)))], true, &[]),
            state: PodState::Running,
            containers: &["init exited 0 Completed:0", "app starting 0 -"],
            actions: vec![Action::Save, Action::StartContainer { index: 1, attempt: 0 }],
        },
        Row {
            what: "an init container that ran unseen when no app had run runs again",
            before: lifecycle(Always, &[("init", Init), ("app", App)]),
            found: found(&[("init", saved(0, Some(7), None))], true, &[]),
            state: PodState::Initializing,
            containers: &["init starting 0 ContainerStatusUnknown:137", "app pending 0 -"],
            actions: vec![Action::Save, Action::StartContainer { index: 0, attempt: 1 }],
        },
        Row {
            what: "once an app container ran, init containers count as done whatever they saved",
            before: lifecycle(Always, &[("init", Init), ("side", Sidecar), ("app", App)]),
            found: found(&[("side", saved(0, Some(6), None)), ("app", saved(0, Some(7), None))], true, &[1, 2]),
            state: PodState::Running,
            containers: &["init exited 0 -", "side running(c1@900) 0 -", "app running(c2@900) 0 -"],
            actions: vec![Action::Save],
        },
        Row {
            what: "a lost sandbox is made again first; what ran in it ended unseen",
            before: lifecycle(Always, &[("app", App)]),
            found: found(&[("app", saved(1, Some(7), None))], false, &[0]),
            state: PodState::Preparing { step: PrepareStep::Sandbox, then: Resume::Running },
            containers: &["app pending 1 ContainerStatusUnknown:137"],
            actions: vec![Action::Save, Action::RunSandbox],
        },
        Row {
            what: "a placed pod that had started nothing initializes",
            before: lifecycle(Always, &[("app", App)]),
            found: found(&[], true, &[]),
            state: PodState::Running,
            containers: &["app starting 0 -"],
            actions: vec![Action::Save, Action::StartContainer { index: 0, attempt: 0 }],
        },
        Row {
            what: "a restore that comes after the pod began changes nothing",
            before: Lifecycle { state: PodState::Admitting, ..lifecycle(Always, &[("app", App)]) },
            found: found(&[("app", saved(5, Some(7), None))], true, &[0]),
            state: PodState::Admitting,
            containers: &["app pending 0 -"],
            actions: vec![],
        },
    ];
    for row in rows {
        let (after, actions) = step(row.before, Input::Restore(Box::new(row.found)), now);
        assert_eq!(after.state, row.state, "{}", row.what);
        assert_eq!(containers(&after), row.containers, "{}", row.what);
        assert_eq!(actions, row.actions, "{}", row.what);
    }
}

#[test]
fn a_container_that_ended_unseen_says_so_with_when_it_ran() {
    let mut p = lifecycle(RestartPolicy::Never, &[("app", Role::App)]);
    p = step(p, Input::Restore(Box::new(found(&[("app", saved(0, Some(7), None))], true, &[]))), Instant::now()).0;
    let last = &p.containers[0].last_exit.as_ref().unwrap().info;
    assert_eq!((last.started_at, last.finished_at), (STARTED, AT));
    assert_eq!(last.message.as_deref(), Some(ENDED_UNSEEN));
    assert_eq!(p.start_time, Some(STARTED), "the pod's start time is the saved one");
}
