//! Event correlation as client-go's recorder does it before an event reaches the apiserver, so that a node
//! emitting the same thing again and again costs the apiserver what a kubelet's would, and `kubectl get events`
//! reads the same: a repeat of an event is one Event with a growing `count` (a patch, not a new object); more than
//! [`AGGREGATE_AFTER`] events about one object that differ only in their message within [`AGGREGATE_WINDOW`] become
//! one Event whose message says they were combined; and each source may post [`SPAM_BURST`] events about one
//! object, then one per [`SPAM_REFILL`].

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use tokio::time::Instant;

/// Events about one object from one source that may be posted at once.
pub const SPAM_BURST: f64 = 25.0;
/// One more such event is allowed per this long.
pub const SPAM_REFILL: Duration = Duration::from_secs(300);
/// Distinct messages of otherwise equal events after which they are combined into one.
pub const AGGREGATE_AFTER: usize = 10;
/// How long after the last of them similar events are still combined.
pub const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
/// The prefix of a combined event's message.
pub const COMBINED: &str = "(combined from similar events): ";
/// Entries each cache keeps, the least recently used dropped first.
const CACHE_ENTRIES: usize = 4096;

/// What to do with an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Correlated {
    /// Create it.
    Create(Event),
    /// It repeats one already posted: patch that one (its name is the event's) with this strategic merge patch of
    /// its count, last timestamp and message; if it is gone, create the event instead.
    Patch(Event, serde_json::Value),
    /// Filtered as spam: post nothing.
    Skip,
}

/// A cache that keeps its most recently used entries.
#[derive(Debug)]
struct Lru<K, V> {
    entries: HashMap<K, (V, u64)>,
    clock: u64,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    fn new(capacity: usize) -> Self {
        Self { entries: HashMap::new(), clock: 0, capacity }
    }

    /// Makes room for `key` if it is new and the cache is full: the least recently used entry goes.
    fn make_room(&mut self, key: &K) {
        self.clock += 1;
        if !self.entries.contains_key(key) && self.entries.len() >= self.capacity {
            let oldest = self.entries.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
    }

    /// Sets the entry of `key`, now the most recently used.
    fn put(&mut self, key: K, value: V) {
        self.make_room(&key);
        self.entries.insert(key, (value, self.clock));
    }

    /// The entry of `key`, made with `make` if there is none, now the most recently used.
    fn entry(&mut self, key: &K, make: impl FnOnce() -> V) -> &mut V {
        self.make_room(key);
        let clock = self.clock;
        let slot = self.entries.entry(key.clone()).or_insert_with(|| (make(), clock));
        slot.1 = clock;
        &mut slot.0
    }
}

/// A token bucket of one source and object.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Similar events seen lately.
#[derive(Debug, Default)]
struct Similar {
    messages: BTreeSet<String>,
    last: Option<Instant>,
}

/// What was posted of an event: the object to patch when it repeats.
#[derive(Debug, Clone)]
struct Posted {
    name: String,
    count: i32,
    first: Option<Time>,
    resource_version: Option<String>,
}

/// The correlation state of one recorder.
#[derive(Debug)]
pub struct Correlator {
    spam: Lru<String, Bucket>,
    similar: Lru<String, Similar>,
    posted: Lru<String, Posted>,
}

impl Default for Correlator {
    fn default() -> Self {
        Self { spam: Lru::new(CACHE_ENTRIES), similar: Lru::new(CACHE_ENTRIES), posted: Lru::new(CACHE_ENTRIES) }
    }
}

/// The fields that name the source and the object an event is about.
fn source_and_object(e: &Event) -> Vec<&str> {
    let source = e.source.as_ref();
    let o = &e.involved_object;
    vec![
        source.and_then(|s| s.component.as_deref()).unwrap_or(""),
        source.and_then(|s| s.host.as_deref()).unwrap_or(""),
        o.kind.as_deref().unwrap_or(""),
        o.namespace.as_deref().unwrap_or(""),
        o.name.as_deref().unwrap_or(""),
        o.uid.as_deref().unwrap_or(""),
        o.api_version.as_deref().unwrap_or(""),
    ]
}

/// The fields joined with a separator no field can hold.
fn key(fields: &[&str]) -> String {
    fields.join("\u{0}")
}

/// What makes an event the same as another: everything a reader sees but the times and count.
fn event_key(e: &Event) -> String {
    let mut fields = source_and_object(e);
    fields.extend([
        e.involved_object.field_path.as_deref().unwrap_or(""),
        e.type_.as_deref().unwrap_or(""),
        e.reason.as_deref().unwrap_or(""),
        e.message.as_deref().unwrap_or(""),
    ]);
    key(&fields)
}

/// What makes events similar: all of [`event_key`] but the message (and the field path), with the reporter.
fn similar_key(e: &Event) -> String {
    let mut fields = source_and_object(e);
    fields.extend([
        e.type_.as_deref().unwrap_or(""),
        e.reason.as_deref().unwrap_or(""),
        e.reporting_component.as_deref().unwrap_or(""),
        e.reporting_instance.as_deref().unwrap_or(""),
    ]);
    key(&fields)
}

impl Correlator {
    /// What to post for `event` (named, with count 1 and both timestamps `wall`), seen at `now`.
    pub fn correlate(&mut self, event: Event, now: Instant, wall: jiff::Timestamp) -> Correlated {
        let (event, key) = self.aggregate(event, now, wall);
        let (event, patch) = self.observe(event, key);
        if self.spam(&event, now) {
            return Correlated::Skip;
        }
        match patch {
            Some(patch) => Correlated::Patch(event, patch),
            None => Correlated::Create(event),
        }
    }

    /// Takes what the apiserver answered for a posted event (its name, count and resource version), so that its
    /// next repeat patches that object.
    pub fn posted(&mut self, answer: &Event) {
        let Some(name) = answer.metadata.name.clone() else { return };
        let posted = Posted {
            name,
            count: answer.count.unwrap_or(1),
            first: answer.first_timestamp.clone(),
            resource_version: answer.metadata.resource_version.clone(),
        };
        self.posted.put(event_key(answer), posted);
    }

    /// The event to post (`event`, or the combined event once similar events are many) and the key its repeats
    /// are counted under.
    fn aggregate(&mut self, event: Event, now: Instant, wall: jiff::Timestamp) -> (Event, String) {
        let similar_key = similar_key(&event);
        let similar = self.similar.entry(&similar_key, Similar::default);
        if similar.last.is_none_or(|last| now.duration_since(last) > AGGREGATE_WINDOW) {
            *similar = Similar::default();
        }
        similar.messages.insert(event.message.clone().unwrap_or_default());
        similar.last = Some(now);
        if similar.messages.len() < AGGREGATE_AFTER {
            let key = event_key(&event);
            return (event, key);
        }
        // The set stays at its bound.
        similar.messages.pop_first();
        let object = event.involved_object.name.as_deref().unwrap_or("");
        let combined = Event {
            metadata: ObjectMeta {
                name: Some(format!("{object}.{:x}", wall.as_nanosecond())),
                namespace: event.metadata.namespace.clone(),
                ..ObjectMeta::default()
            },
            message: Some(format!("{COMBINED}{}", event.message.as_deref().unwrap_or(""))),
            count: Some(1),
            first_timestamp: Some(Time(wall)),
            last_timestamp: Some(Time(wall)),
            ..event
        };
        (combined, similar_key)
    }

    /// `event` as a repeat of what was posted under `key`, if it was: that object's name, first time and count
    /// plus one, with the patch that brings it there.
    fn observe(&mut self, mut event: Event, key: String) -> (Event, Option<serde_json::Value>) {
        let previous = self.posted.entry(&key, || Posted {
            name: event.metadata.name.clone().unwrap_or_default(),
            count: 0,
            first: event.first_timestamp.clone(),
            resource_version: None,
        });
        let patch = (previous.count > 0).then(|| {
            event.metadata.name = Some(previous.name.clone());
            event.metadata.resource_version = previous.resource_version.clone();
            event.first_timestamp = previous.first.clone();
            event.count = Some(previous.count.saturating_add(1));
            serde_json::json!({
                "count": event.count,
                "lastTimestamp": event.last_timestamp,
                "message": event.message,
            })
        });
        previous.count = event.count.unwrap_or(1);
        (event, patch)
    }

    /// Whether the event's source has spent its budget for the object.
    fn spam(&mut self, event: &Event, now: Instant) -> bool {
        let bucket = self.spam.entry(&key(&source_and_object(event)), || Bucket { tokens: SPAM_BURST, at: now });
        let refilled = now.duration_since(bucket.at).as_secs_f64() / SPAM_REFILL.as_secs_f64();
        bucket.tokens = (bucket.tokens + refilled).min(SPAM_BURST);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return true;
        }
        bucket.tokens -= 1.0;
        false
    }

    #[cfg(test)]
    fn cached(&self) -> (usize, usize, usize) {
        (self.spam.entries.len(), self.similar.entries.len(), self.posted.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{NodeEvent, event_object};

    /// An event about Node `object` from its own kubelet, as the node side makes them.
    fn event(object: &str, reason: &str, message: &str, wall: jiff::Timestamp) -> Event {
        let e = NodeEvent { at: wall, ..NodeEvent::now("Normal", reason, message.into(), None) };
        event_object(object, &e)
    }

    fn wall(second: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_700_000_000 + second).unwrap()
    }

    /// Posts what `c` says to post as an apiserver would answer it (a resource version per write).
    fn post(c: &mut Correlator, e: Event, now: Instant, at: i64) -> Correlated {
        let out = c.correlate(e, now, wall(at));
        if let Correlated::Create(e) | Correlated::Patch(e, _) = &out {
            let mut answer = e.clone();
            answer.metadata.resource_version = Some(format!("rv{at}"));
            c.posted(&answer);
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeat_is_a_patch_of_the_first_with_its_count() {
        let mut c = Correlator::default();
        let t0 = Instant::now();
        let Correlated::Create(first) = post(&mut c, event("n1", "NodeNotReady", "down", wall(0)), t0, 0) else {
            panic!("the first is created")
        };
        tokio::time::advance(Duration::from_secs(7)).await;
        let out = post(&mut c, event("n1", "NodeNotReady", "down", wall(7)), Instant::now(), 7);
        let Correlated::Patch(repeat, patch) = out else { panic!("a repeat is a patch: {out:?}") };
        assert_eq!(repeat.metadata.name, first.metadata.name, "the same object");
        assert_eq!(repeat.metadata.resource_version.as_deref(), Some("rv0"));
        assert_eq!(repeat.count, Some(2));
        assert_eq!(repeat.first_timestamp, Some(Time(wall(0))));
        assert_eq!(repeat.last_timestamp, Some(Time(wall(7))));
        assert_eq!(patch["count"], 2);
        assert_eq!(patch["message"], "down");
        assert_eq!(patch["lastTimestamp"], serde_json::to_value(Time(wall(7))).unwrap());
        let Correlated::Patch(third, _) = post(&mut c, event("n1", "NodeNotReady", "down", wall(9)), Instant::now(), 9)
        else {
            panic!("a third is a patch too")
        };
        assert_eq!(third.count, Some(3));
        // Another message, or another object, is an event of its own.
        let other = post(&mut c, event("n1", "NodeNotReady", "still down", wall(10)), Instant::now(), 10);
        assert!(matches!(other, Correlated::Create(_)), "{other:?}");
        let other = post(&mut c, event("n2", "NodeNotReady", "down", wall(10)), Instant::now(), 10);
        assert!(matches!(other, Correlated::Create(_)), "{other:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn similar_events_are_combined_from_the_tenth_message() {
        let mut c = Correlator::default();
        for i in 0..9 {
            let out = post(&mut c, event("n1", "Unhealthy", &format!("probe {i}"), wall(i)), Instant::now(), i);
            assert!(matches!(&out, Correlated::Create(e) if e.message.as_deref() == Some(&format!("probe {i}"))));
        }
        let out = post(&mut c, event("n1", "Unhealthy", "probe 9", wall(9)), Instant::now(), 9);
        let Correlated::Create(combined) = out else { panic!("the tenth makes the combined event: {out:?}") };
        assert_eq!(combined.message.as_deref(), Some("(combined from similar events): probe 9"));
        assert_eq!(combined.reason.as_deref(), Some("Unhealthy"));
        assert_eq!(combined.count, Some(1));
        // The next similar one counts on the combined event.
        let out = post(&mut c, event("n1", "Unhealthy", "probe 10", wall(10)), Instant::now(), 10);
        let Correlated::Patch(again, patch) = out else { panic!("then it is patched: {out:?}") };
        assert_eq!(again.metadata.name, combined.metadata.name);
        assert_eq!(again.count, Some(2));
        assert_eq!(patch["message"], "(combined from similar events): probe 10");
        // Another reason is not similar.
        let out = post(&mut c, event("n1", "BackOff", "probe 11", wall(11)), Instant::now(), 11);
        assert!(matches!(&out, Correlated::Create(e) if e.message.as_deref() == Some("probe 11")), "{out:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn similar_events_further_apart_than_the_window_start_over() {
        let mut c = Correlator::default();
        for i in 0..9 {
            post(&mut c, event("n1", "Unhealthy", &format!("probe {i}"), wall(i)), Instant::now(), i);
        }
        tokio::time::advance(AGGREGATE_WINDOW + Duration::from_secs(1)).await;
        let out = post(&mut c, event("n1", "Unhealthy", "probe 9", wall(700)), Instant::now(), 700);
        assert!(matches!(&out, Correlated::Create(e) if e.message.as_deref() == Some("probe 9")), "{out:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_gets_a_burst_per_object_then_one_event_per_refill() {
        let mut c = Correlator::default();
        // Distinct reasons, so that nothing is combined or counted.
        let mut posted = 0;
        for i in 0..40 {
            let out = post(&mut c, event("n1", &format!("R{i}"), "m", wall(i)), Instant::now(), i);
            posted += usize::from(out != Correlated::Skip);
        }
        assert_eq!(posted, 25);
        // Another object has a budget of its own.
        assert_ne!(post(&mut c, event("n2", "R", "m", wall(41)), Instant::now(), 41), Correlated::Skip);
        tokio::time::advance(SPAM_REFILL).await;
        assert_ne!(post(&mut c, event("n1", "R100", "m", wall(400)), Instant::now(), 400), Correlated::Skip);
        assert_eq!(post(&mut c, event("n1", "R101", "m", wall(401)), Instant::now(), 401), Correlated::Skip);
    }

    #[tokio::test(start_paused = true)]
    async fn the_caches_stay_bounded() {
        let mut c = Correlator::default();
        for i in 0..i64::try_from(CACHE_ENTRIES + 100).unwrap() {
            post(&mut c, event(&format!("o{i}"), "R", "m", wall(i)), Instant::now(), i);
        }
        let (spam, similar, posted) = c.cached();
        assert!(spam <= CACHE_ENTRIES && similar <= CACHE_ENTRIES && posted <= CACHE_ENTRIES, "{:?}", c.cached());
    }
}
