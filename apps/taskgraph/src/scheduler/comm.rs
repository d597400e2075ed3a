//! The comm thread of one rank: it takes the handle's events, schedules successors
//! from them (see the activation path in the [parent module](super)), and, when ranks
//! die, agrees on `G`, exchanges holdings and recovers what was lost.
//!
//! Invariants: every event is handled once, by this thread alone; recovery starts only
//! from an agreed `G`, so every survivor computes the same owners and the same
//! re-sends; a dying rank leaves only after its last words were acknowledged or their
//! addressees are known dead.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use ft::{Event, OutputSet, Rank, RankSet, TaskId};

use super::{
    count, RankRun, Report, KIND, TAG_ACK, TAG_DATA, TAG_FINISH, TAG_HOLDINGS, TAG_LAST_WORDS,
    TAG_LAST_WORDS_ACK, TICK,
};
use crate::graph::{Header, OutputId, TaskIdx};
use crate::recovery::{owner, plan, Holdings};

impl RankRun<'_> {
    /// The comm thread's loop; the report, at the reporting rank.
    pub(super) fn comm(&self, start: Instant) -> Result<Option<Report>, String> {
        let me = self.me;
        let mut arrivals: HashMap<TaskId, Header> = HashMap::new();
        let mut holdings: BTreeMap<u32, BTreeMap<Rank, Holdings>> = BTreeMap::new();
        let mut pending: Option<u32> = None;
        let mut finish_sent = false;
        // The runs each rank that acknowledged the end completed.
        let mut acked: BTreeMap<Rank, u64> = BTreeMap::new();
        // While dying: the ranks yet to acknowledge this rank's last words.
        let mut words: Option<HashSet<Rank>> = None;
        loop {
            if self.lock().stop {
                return Ok(None);
            }
            if self.lock().dying && self.last_words(&mut words) {
                self.lock().stop = true;
                self.wake.notify_all();
                (self.die)();
                return Ok(None);
            }
            if start.elapsed() > self.opts.limit {
                return Err(format!(
                    "rank {me}: the job did not end within {:?}",
                    self.opts.limit
                ));
            }
            let event = match self.handle.next_event(Some(TICK)) {
                Ok(event) => event,
                Err(e) => return Err(format!("rank {me}: {e}")),
            };
            match event {
                Some(Event::Arrived { task, header, .. }) => {
                    match Header::decode(&header, self.graph) {
                        Ok(h) => {
                            self.lock().ran.set(h.task);
                            arrivals.entry(task).or_insert(h);
                        }
                        Err(e) => eprintln!("rank {me}: from rank {}: {e}; ignored", task.root),
                    }
                }
                Some(Event::OutputReady { task, output }) => {
                    let Some(h) = arrivals.get(&task) else {
                        eprintln!(
                            "rank {me}: output {output} of {task} without an arrival; ignored"
                        );
                        continue;
                    };
                    let Some(&j) = h.outputs.get(output as usize) else {
                        eprintln!(
                            "rank {me}: output {output} of {task} is not in its header; ignored"
                        );
                        continue;
                    };
                    let o = self.graph.task(h.task).first_output + j;
                    if self.lock().held.contains_key(&o) {
                        continue;
                    }
                    match self.handle.wait_outputs(
                        task,
                        OutputSet::single(output),
                        Some(Duration::ZERO),
                    ) {
                        Ok(data) => {
                            for (_, bytes) in data {
                                self.deliver(o, bytes);
                            }
                        }
                        Err(e) => eprintln!("rank {me}: output {output} of {task}: {e}"),
                    }
                }
                Some(Event::RankFailed { rank }) => {
                    self.lock().known.insert(rank);
                    if let Some(w) = &mut words {
                        w.remove(&rank);
                    }
                }
                Some(Event::Message { from, tag, bytes }) => match tag & KIND {
                    TAG_HOLDINGS => match Holdings::decode(&bytes, self.graph) {
                        Ok(h) => {
                            holdings.entry(h.epoch).or_default().insert(from, h);
                        }
                        Err(e) => eprintln!("rank {me}: holdings from rank {from}: {e}; ignored"),
                    },
                    // A dying rank does not take part in the end: it dies.
                    TAG_FINISH if self.lock().dying => {}
                    TAG_FINISH => {
                        let executed = self.lock().executed;
                        let _ = self
                            .handle
                            .send(from, TAG_ACK, executed.to_le_bytes().to_vec());
                        return Ok(None);
                    }
                    TAG_ACK => match count(&bytes) {
                        Some(runs) => {
                            acked.insert(from, runs);
                        }
                        None => eprintln!(
                            "rank {me}: end ack of {} bytes from rank {from}; ignored",
                            bytes.len()
                        ),
                    },
                    TAG_LAST_WORDS => match count(&bytes) {
                        Some(runs) => {
                            self.lock().last_words.insert(from, runs);
                            let _ = self.handle.send(from, TAG_LAST_WORDS_ACK, Vec::new());
                        }
                        None => eprintln!(
                            "rank {me}: last words of {} bytes from rank {from}; ignored",
                            bytes.len()
                        ),
                    },
                    TAG_LAST_WORDS_ACK => {
                        if let Some(w) = &mut words {
                            w.remove(&from);
                        }
                    }
                    TAG_DATA => {
                        self.deliver((tag & !KIND) as OutputId, bytes);
                    }
                    _ => eprintln!(
                        "rank {me}: message of unknown tag {tag:#x} from rank {from}; ignored"
                    ),
                },
                _ => {}
            }
            // Agree on every failure reported (the baseline has no recovery).
            loop {
                let (known, dead) = {
                    let s = self.lock();
                    (s.known.clone(), s.dead.clone())
                };
                if known.is_subset(&dead) || self.opts.baseline {
                    break;
                }
                let agreed = self
                    .handle
                    .validate_global()
                    .map_err(|e| format!("rank {me}: validate_global: {e}"))?;
                let mine = {
                    let mut s = self.lock();
                    s.dead = agreed.agreed.clone();
                    let dead = s.dead.clone();
                    s.known.union_with(&dead);
                    let mut h = Holdings::new(self.graph, agreed.epoch);
                    for &o in s.held.keys() {
                        h.held.set(o);
                    }
                    h.ran = s.ran.clone();
                    h
                };
                let message = mine.encode();
                for r in (0..self.n).filter(|&r| r != me && !agreed.agreed.contains(r)) {
                    let _ = self.handle.send(
                        r,
                        TAG_HOLDINGS | u64::from(agreed.epoch),
                        message.clone(),
                    );
                }
                holdings.entry(agreed.epoch).or_default().insert(me, mine);
                pending = Some(agreed.epoch);
                let mut s = self.lock();
                self.arm_kill(&mut s);
            }
            if let Some(epoch) = pending {
                let dead = self.lock().dead.clone();
                let have = holdings.get(&epoch).map_or(0, BTreeMap::len);
                if have == (self.n as usize - dead.len()) {
                    let all = holdings.remove(&epoch).unwrap_or_default();
                    holdings.retain(|&e, _| e > epoch);
                    self.recover(&dead, &all);
                    pending = None;
                }
            }
            // The reporter ends the job once every live rank acknowledged.
            let s = self.lock();
            if owner(self.graph, self.graph.collector(), &s.dead) != me {
                continue;
            }
            if let Some((finish, sum, end)) = s.result.clone() {
                let live: Vec<Rank> = (0..self.n)
                    .filter(|&r| r != me && !s.known.contains(r))
                    .collect();
                let executed = s.executed;
                drop(s);
                if !finish_sent {
                    for &r in &live {
                        let _ = self.handle.send(r, TAG_FINISH, Vec::new());
                    }
                    finish_sent = true;
                }
                if live.iter().all(|r| acked.contains_key(r)) {
                    let s = self.lock();
                    let mut dead: Vec<Rank> = s
                        .dead
                        .iter()
                        .chain(s.known.iter())
                        .filter(|r| !acked.contains_key(r))
                        .collect();
                    dead.sort_unstable();
                    dead.dedup();
                    // ANCHOR: count
                    // Every run completed anywhere: here, at each rank that acknowledged
                    // the end, and at each dead rank, from its last words.
                    let mut executed = executed + acked.values().sum::<u64>();
                    let mut uncounted = Vec::new();
                    for &d in &dead {
                        match s.last_words.get(&d) {
                            Some(&runs) => executed += runs,
                            None => uncounted.push(d),
                        }
                    }
                    let reexecuted = executed.saturating_sub(self.graph.work_tasks() as u64);
                    // ANCHOR_END: count
                    return Ok(Some(Report {
                        finish,
                        checksum: sum,
                        seconds: end.duration_since(start).as_secs_f64(),
                        dead,
                        executed,
                        reexecuted,
                        uncounted,
                    }));
                }
            }
        }
    }

    /// A dying rank's last words: it tells every live rank (but those dying in the same
    /// flag) how many task runs it completed, so that the report counts them; the
    /// survivors use them for nothing else. Whether every addressee acknowledged them
    /// or is known dead, so that the rank may die now.
    fn last_words(&self, words: &mut Option<HashSet<Rank>>) -> bool {
        let words = words.get_or_insert_with(|| {
            let s = self.lock();
            let together: &[Rank] = self
                .opts
                .kills
                .iter()
                .find(|f| f.ranks.contains(&self.me))
                .map_or(&[], |f| &f.ranks);
            let bytes = s.executed.to_le_bytes().to_vec();
            let to: Vec<Rank> = (0..self.n)
                .filter(|&r| r != self.me && !s.known.contains(r) && !together.contains(&r))
                .collect();
            drop(s);
            to.into_iter()
                .filter(|&r| self.handle.send(r, TAG_LAST_WORDS, bytes.clone()).is_ok())
                .collect()
        });
        words.is_empty()
    }

    /// Applies the plan after `G = dead`: runs what must run here, re-sends what this
    /// rank was picked to re-send, and re-publishes what it ran since its holdings.
    fn recover(&self, dead: &RankSet, holdings: &BTreeMap<Rank, Holdings>) {
        let collected = holdings.values().any(|h| h.ran.get(self.graph.collector()));
        let p = plan(self.graph, dead, holdings, collected);
        if std::env::var_os("FTTASK_DEBUG").is_some() {
            let count = |v: &[bool]| v.iter().filter(|&&b| b).count();
            eprintln!(
                "rank {}: plan after G = {:?}: {} tasks to run, {} of them again, {} re-sends",
                self.me,
                dead.iter().collect::<Vec<_>>(),
                count(&p.must_run),
                count(&p.rerun),
                p.resends.len()
            );
        }
        let mut republish = Vec::new();
        let mut resends = Vec::new();
        {
            let mut s = self.lock();
            s.needed = p.must_run.clone();
            for t in 0..self.graph.tasks.len() as TaskIdx {
                let i = t as usize;
                s.runs[i] = p.must_run[i] && owner(self.graph, t, dead) == self.me;
                if s.runs[i] && s.done[i] && !holdings[&self.me].ran.get(t) {
                    republish.push(t);
                } else {
                    self.maybe_ready(&mut s, t);
                }
            }
            for (&(sender, t), outs) in &p.resends {
                if sender != self.me {
                    continue;
                }
                let sends: Vec<_> = outs
                    .iter()
                    .filter_map(|(o, dests)| s.held.get(o).map(|b| (*o, b.clone(), dests.clone())))
                    .collect();
                resends.push((t, sends));
            }
            for &t in &republish {
                let sends: Vec<_> = self
                    .graph
                    .task(t)
                    .output_ids()
                    .filter_map(|o| s.held.get(&o).map(|b| (o, b.clone(), self.dests(&s, o))))
                    .collect();
                resends.push((t, sends));
            }
        }
        self.wake.notify_all();
        for (t, sends) in resends {
            self.publish(t, sends);
        }
    }
}
