//! The predictive policy (`[runners.autoscaler.predictive]`): a forecast of the job slots a
//! runner will need, learned from its own history, and a learned idle keep-alive.
//!
//! What it learns, all from what the engine sees (acquires and releases, instance lead times):
//! - **demand rise**: for every slot of every day (`slot_length`, 5 minutes by default), the largest rise of slots in use
//!   (acquired + waiting jobs) within one lead time. Kept for `history_days` days; the forecast
//!   for a slot is the `headroom_quantile` of the same slot (± one slot) on past days of the
//!   same weekday (time-of-day and day-of-week seasonality), or of the same day type
//!   (weekday / weekend) while fewer than four such days are known, or the largest rise of
//!   the last hour while none is;
//! - **arrival rate**: the median per-minute arrivals of the last `recent_window`, scaled to
//!   one lead time;
//! - **lead time**: the 90th percentile of request → ready of the last 64 instances (or
//!   `lead_time` when set);
//! - **keep-alive** per hour of week ("Serverless in the Wild", ATC'20): the
//!   `keep_alive_quantile` of the gaps between job arrivals in that hour; an hour whose
//!   quantile exceeds `max_idle_time` is out of bounds, and its idle instances leave after
//!   `min_idle_time` (pre-warming, not keep-alive, covers its next jobs). Never below one lead
//!   time: a replacement costs at least that.
//! - **release profile** (`release_horizon`, off by default): per slot of every day, the largest
//!   rise within that horizon, forecast like the demand rise ([`Predictor::keep_level`]); the
//!   engine releases idle instances beyond it at once (scale-down to the forecast level).
//!
//! The engine asks [`Predictor::idle_target`] for the idle slots to hold ahead of demand (the
//! policies' idle target stays a floor) and [`Predictor::keep_alive`] for the idle time.
//! Its learned state ([`PredictorState`]) rides in the engine snapshot, so it survives restarts.
//! Owns the forecast only: must not touch instances, the provider or the clock.

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::clock::Moment;

/// Default width of a forecast slot (`slot_length`), seconds; also the width of history saved
/// before the setting existed.
pub const DEFAULT_SLOT_SECS: u64 = 300;
const DAY_MS: u64 = 86_400_000;
const HOUR_MS: u64 = 3_600_000;
const LEAD_SAMPLES: usize = 64;
/// Lead time assumed before any instance was seen ready.
const DEFAULT_LEAD: Duration = Duration::from_secs(90);

/// Settings of `[runners.autoscaler.predictive]`.
#[derive(Clone, Debug, PartialEq)]
pub struct PredictiveSettings {
    /// Days of history kept (the forecast's memory).
    pub history_days: u32,
    /// Quantile of past days' demand rises provisioned ahead (0–1).
    pub headroom_quantile: f64,
    /// Time from requesting an instance to its first job; `None` = learned (p90 of the last
    /// 64 instances, 90 s before the first).
    pub lead_time: Option<Duration>,
    /// Window of the current arrival rate.
    pub recent_window: Duration,
    /// Quantile of an hour's arrival gaps an idle instance is kept for (0–1).
    pub keep_alive_quantile: f64,
    /// Longest keep-alive; an hour whose gaps exceed it releases idle instances early.
    pub max_idle_time: Duration,
    /// Shortest keep-alive (e.g. the cloud's billing minimum).
    pub min_idle_time: Duration,
    /// Width of a forecast slot: the granularity of the learned day profile. Whole seconds
    /// that divide a day, 10 s to 1 h.
    pub slot_length: Duration,
    /// Past days a slot's rise must have been seen on before it is provisioned ahead: the
    /// forecast is at most the `min_recurrence`-th largest of the past days' rises (1 = the
    /// quantile alone, so a rise seen once is pre-warmed while few days are known).
    pub min_recurrence: u32,
    /// Scale-down to the forecast level: when set, the largest rise of slots in use within this
    /// horizon is learned per slot like the demand rise, and idle instances beyond the slots in
    /// use plus that forecast (and the idle target) leave at once instead of after their
    /// keep-alive. `None` = off (every idle instance above the target waits for its keep-alive).
    pub release_horizon: Option<Duration>,
}

impl Default for PredictiveSettings {
    fn default() -> Self {
        PredictiveSettings {
            history_days: 28,
            headroom_quantile: 0.8,
            lead_time: None,
            recent_window: Duration::from_secs(300),
            keep_alive_quantile: 0.95,
            max_idle_time: Duration::from_secs(20 * 60),
            min_idle_time: Duration::from_secs(60),
            slot_length: Duration::from_secs(DEFAULT_SLOT_SECS),
            min_recurrence: 1,
            release_horizon: None,
        }
    }
}

/// A `[runners.autoscaler.predictive]` value out of range; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PredictiveError(pub String);

impl PredictiveSettings {
    /// Check ranges; the message names the key.
    pub fn validate(&self) -> Result<(), PredictiveError> {
        if self.history_days == 0 {
            return Err(PredictiveError("predictive.history_days must be at least 1".into()));
        }
        for (key, q) in
            [("headroom_quantile", self.headroom_quantile), ("keep_alive_quantile", self.keep_alive_quantile)]
        {
            if !(q > 0.0 && q <= 1.0) {
                return Err(PredictiveError(format!("predictive.{key} must be in (0, 1]")));
            }
        }
        if self.recent_window.is_zero() {
            return Err(PredictiveError("predictive.recent_window must be positive".into()));
        }
        if self.min_idle_time > self.max_idle_time {
            return Err(PredictiveError("predictive.min_idle_time must not exceed predictive.max_idle_time".into()));
        }
        if self.min_recurrence == 0 {
            return Err(PredictiveError("predictive.min_recurrence must be at least 1".into()));
        }
        if self.release_horizon.is_some_and(|h| h.is_zero() || h.as_secs() > 86_400) {
            return Err(PredictiveError("predictive.release_horizon must be from 1s to 24h".into()));
        }
        let slot = self.slot_length;
        if slot.subsec_nanos() != 0 || !(10..=3600).contains(&slot.as_secs()) || 86_400 % slot.as_secs() != 0 {
            return Err(PredictiveError(format!(
                "predictive.slot_length must be whole seconds from 10s to 1h that divide a day, got {slot:?}"
            )));
        }
        Ok(())
    }
}

/// One day of demand rises, per forecast slot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DayRecord {
    /// Days since the Unix epoch (UTC).
    pub day: u64,
    /// Largest rise of slots in use within one lead time, per slot of the day.
    pub rise: Vec<u16>,
    /// Largest rise within `release_horizon`, per slot of the day (empty when it is off).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rise_long: Vec<u16>,
}

/// What the predictor has learned; persisted with the engine snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PredictorState {
    /// Width of the slots of `days`, seconds (history saved before the setting existed has
    /// none: 300). History of another width is dropped when the predictor starts.
    #[serde(default = "default_slot_secs")]
    pub slot_secs: u64,
    /// Past days, oldest first (the current day last while it runs).
    pub days: VecDeque<DayRecord>,
    /// Observed request → ready times, seconds (last 64).
    pub lead_samples: VecDeque<f64>,
    /// Learned keep-alive per hour of week (Monday 00:00 UTC = 0), seconds; `None` = unknown.
    pub keep_alive_week: Vec<Option<f64>>,
    /// Learned keep-alive per hour of day (fallback while the hour of week is unknown).
    pub keep_alive_day: Vec<Option<f64>>,
}

fn default_slot_secs() -> u64 {
    DEFAULT_SLOT_SECS
}

impl Default for PredictorState {
    fn default() -> Self {
        PredictorState {
            slot_secs: DEFAULT_SLOT_SECS,
            days: VecDeque::new(),
            lead_samples: VecDeque::new(),
            keep_alive_week: Vec::new(),
            keep_alive_day: Vec::new(),
        }
    }
}

/// The forecaster. See the module docs.
#[derive(Clone, Debug)]
pub struct Predictor {
    settings: PredictiveSettings,
    state: PredictorState,
    /// (time, in-use) with increasing in-use: the sliding minimum over one lead time.
    window_min: VecDeque<(Moment, u32)>,
    /// The same over `release_horizon` (empty when it is off).
    long_min: VecDeque<(Moment, u32)>,
    in_use: u32,
    arrivals: VecDeque<Moment>,
    last_arrival: Option<Moment>,
    hour: Option<u64>,
    hour_gaps: Vec<f64>,
    revision: u64,
    /// `slot_length` in milliseconds, and the slots of a day.
    slot_ms: u64,
    slots_per_day: usize,
}

fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    Some(values[rank - 1])
}

/// Day of week of a day number (0 = Monday; 1970-01-01 was a Thursday).
fn weekday(day: u64) -> u64 {
    (day + 3) % 7
}

impl Predictor {
    /// A predictor with no history, or resuming `state` (from a snapshot).
    pub fn new(settings: PredictiveSettings, state: Option<PredictorState>) -> Self {
        let mut state = state.unwrap_or_default();
        let slot_secs = settings.slot_length.as_secs().max(1);
        let slots_per_day = (86_400 / slot_secs) as usize;
        if state.slot_secs != slot_secs {
            if !state.days.is_empty() {
                tracing::warn!(
                    saved = state.slot_secs,
                    configured = slot_secs,
                    "predictive.slot_length changed: the demand history of the old slot width is dropped"
                );
            }
            state.days.clear();
            state.slot_secs = slot_secs;
        }
        state.keep_alive_week.resize(168, None);
        state.keep_alive_day.resize(24, None);
        for d in &mut state.days {
            d.rise.resize(slots_per_day, 0);
            // A day learned while `release_horizon` was off has no such profile: it stays empty
            // (not read as "no rise"), and the profile is dropped while the setting is off.
            if settings.release_horizon.is_none() {
                d.rise_long.clear();
            } else if !d.rise_long.is_empty() {
                d.rise_long.resize(slots_per_day, 0);
            }
        }
        Predictor {
            settings,
            state,
            window_min: VecDeque::new(),
            long_min: VecDeque::new(),
            in_use: 0,
            arrivals: VecDeque::new(),
            last_arrival: None,
            hour: None,
            hour_gaps: Vec::new(),
            revision: 0,
            slot_ms: slot_secs * 1000,
            slots_per_day,
        }
    }

    /// The learned state, for the snapshot.
    pub fn state(&self) -> &PredictorState {
        &self.state
    }

    /// Changes when something worth saving was learned (a day, an hour or a lead sample).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The settings in force.
    pub fn settings(&self) -> &PredictiveSettings {
        &self.settings
    }

    /// Time from requesting an instance to its first job: configured, or learned.
    pub fn lead_time(&self) -> Duration {
        if let Some(lead) = self.settings.lead_time {
            return lead;
        }
        let mut samples: Vec<f64> = self.state.lead_samples.iter().copied().collect();
        quantile(&mut samples, 0.9).map_or(DEFAULT_LEAD, Duration::from_secs_f64)
    }

    /// An instance requested at `requested` became ready at `ready`.
    pub fn observe_lead(&mut self, requested: Moment, ready: Moment) {
        self.state.lead_samples.push_back(ready.since(requested).as_secs_f64());
        while self.state.lead_samples.len() > LEAD_SAMPLES {
            self.state.lead_samples.pop_front();
        }
        self.revision += 1;
    }

    /// A job asked for a slot at `now`.
    pub fn observe_arrival(&mut self, now: Moment) {
        self.roll_hour(now);
        if let Some(last) = self.last_arrival {
            if now > last {
                self.hour_gaps.push(now.since(last).as_secs_f64());
            }
        }
        self.last_arrival = Some(now);
        self.arrivals.push_back(now);
    }

    /// Slots in use (acquired + waiting) at `now`; called on every engine tick.
    pub fn observe_in_use(&mut self, now: Moment, in_use: u32) {
        self.roll_hour(now);
        let lead = self.lead_time();
        let rise = sliding_rise(&mut self.window_min, now, lead, in_use);
        let long_rise = self.settings.release_horizon.map(|h| sliding_rise(&mut self.long_min, now, h, in_use));
        self.in_use = in_use;
        let (day, slot) = (now.0 / DAY_MS, ((now.0 % DAY_MS) / self.slot_ms) as usize);
        let record = self.day_record(day);
        if let Some(r) = record.rise.get_mut(slot) {
            *r = (*r).max(rise);
        }
        if let (Some(v), Some(r)) = (long_rise, record.rise_long.get_mut(slot)) {
            *r = (*r).max(v);
        }
        let horizon = now.minus(self.settings.recent_window);
        while self.arrivals.front().is_some_and(|t| *t < horizon) {
            self.arrivals.pop_front();
        }
    }

    fn day_record(&mut self, day: u64) -> &mut DayRecord {
        if self.state.days.back().is_none_or(|d| d.day != day) {
            let long_len = if self.settings.release_horizon.is_some() { self.slots_per_day } else { 0 };
            self.state.days.push_back(DayRecord {
                day,
                rise: vec![0; self.slots_per_day],
                rise_long: vec![0; long_len],
            });
            while self.state.days.len() > self.settings.history_days as usize + 1 {
                self.state.days.pop_front();
            }
            self.revision += 1;
        }
        let last = self.state.days.len() - 1;
        &mut self.state.days[last]
    }

    /// Close the previous hour's keep-alive statistics when the hour changes.
    fn roll_hour(&mut self, now: Moment) {
        let hour = now.0 / HOUR_MS;
        match self.hour {
            Some(h) if h == hour => return,
            Some(h) => {
                let mut gaps = std::mem::take(&mut self.hour_gaps);
                // The gap still open at the end of the hour counts too (censored), so a
                // sparse hour reads as long gaps rather than as no information.
                if let Some(last) = self.last_arrival {
                    gaps.push(Moment((h + 1) * HOUR_MS).since(last).as_secs_f64());
                }
                if !gaps.is_empty() {
                    if let Some(q) = quantile(&mut gaps, self.settings.keep_alive_quantile) {
                        let week = ((h / 24 + 3) % 7 * 24 + h % 24) as usize;
                        let blend = |old: Option<f64>| Some(old.map_or(q, |o| 0.5 * o + 0.5 * q));
                        self.state.keep_alive_week[week] = blend(self.state.keep_alive_week[week]);
                        let day = (h % 24) as usize;
                        self.state.keep_alive_day[day] = blend(self.state.keep_alive_day[day]);
                        self.revision += 1;
                    }
                }
            }
            None => {}
        }
        self.hour = Some(hour);
        self.hour_gaps.clear();
    }

    /// The forecast rise for one slot of `day`, from past days (never the current one): the
    /// headroom quantile over past days of the same weekday once four are known, else over
    /// past days of the same day type (weekday / weekend); with no such day yet, the largest
    /// rise of the last hour of the current day.
    fn forecast_slot(&self, day: u64, slot: usize, series: Series) -> f64 {
        let wd = weekday(day);
        let weekend = |d: u64| weekday(d) >= 5;
        // Days that learned this series (the release profile may be missing on older days).
        let past = || self.state.days.iter().filter(|r| r.day < day && !series.of(r).is_empty());
        let same_day: Vec<&DayRecord> = past().filter(|r| weekday(r.day) == wd).collect();
        let days: Vec<&DayRecord> =
            if same_day.len() >= 4 { same_day } else { past().filter(|r| weekend(r.day) == weekend(day)).collect() };
        if days.is_empty() {
            // Nothing learned for this day type yet: the largest rise of the last hour today.
            return self.state.days.back().filter(|r| r.day == day).map_or(0.0, |r| {
                let rises = series.of(r);
                let lo = slot.saturating_sub((HOUR_MS / self.slot_ms) as usize);
                f64::from(rises[lo.min(rises.len())..slot.min(rises.len())].iter().copied().max().unwrap_or(0))
            });
        }
        let mut values: Vec<f64> =
            days.iter().map(|r| f64::from(series.of(r).get(slot).copied().unwrap_or(0))).collect();
        let forecast = quantile(&mut values, self.settings.headroom_quantile).unwrap_or(0.0);
        // `values` is sorted now: a rise must have been seen on `min_recurrence` past days.
        let recurring = values.len().checked_sub(self.settings.min_recurrence as usize).map_or(0.0, |i| values[i]);
        forecast.min(recurring)
    }

    /// The largest forecast rise of `series` for the slots from `now` to `now + horizon`; for
    /// the lead-time rise, less what already rose in the current slot (the long rise seen so
    /// far mostly rose before the slot and says little about what is still to come).
    fn forecast_ahead(&self, now: Moment, horizon: Duration, series: Series) -> f64 {
        let slot_ms = self.slot_ms;
        let current = now.0 / slot_ms;
        let last = now.plus(horizon).0 / slot_ms;
        let mut target = 0.0f64;
        for s in current..=last {
            let day = s * slot_ms / DAY_MS;
            let slot = ((s * slot_ms % DAY_MS) / slot_ms) as usize;
            let mut forecast = self.forecast_slot(day, slot, series);
            if s == current && matches!(series, Series::Lead) {
                let seen = self
                    .state
                    .days
                    .back()
                    .filter(|d| d.day == day)
                    .and_then(|d| series.of(d).get(slot))
                    .copied()
                    .unwrap_or(0);
                forecast = (forecast - f64::from(seen)).max(0.0);
            }
            target = target.max(forecast);
        }
        target
    }

    /// Idle slots worth keeping at `now` under `release_horizon` (scale-down to the forecast
    /// level): the rise of slots in use forecast within the horizon. `None` when it is off.
    pub fn keep_level(&self, now: Moment) -> Option<u32> {
        let horizon = self.settings.release_horizon?;
        Some(self.forecast_ahead(now, horizon, Series::Long).ceil() as u32)
    }

    /// Idle slots to hold at `now`: the rise forecast for the slots the next lead time
    /// touches (less what already arrived in the current slot), or the current arrival rate
    /// over one lead time, whichever is larger.
    pub fn idle_target(&self, now: Moment) -> u32 {
        let lead = self.lead_time();
        let mut target = self.forecast_ahead(now, lead, Series::Lead);
        target = target.max(self.recent_rate(now) * lead.as_secs_f64());
        target.ceil() as u32
    }

    /// The current arrival rate (jobs per second): the median of the per-minute arrival
    /// counts of the recent window, so one burst (already answered by the queue) does not
    /// inflate it.
    fn recent_rate(&self, now: Moment) -> f64 {
        let minutes = (self.settings.recent_window.as_secs() / 60).max(1) as usize;
        let mut counts = vec![0.0f64; minutes];
        for t in &self.arrivals {
            let age = (now.since(*t).as_secs() / 60) as usize;
            if let Some(c) = counts.get_mut(age) {
                *c += 1.0;
            }
        }
        quantile(&mut counts, 0.5).unwrap_or(0.0) / 60.0
    }

    /// How long an instance above the idle target may stay idle at `now`.
    pub fn keep_alive(&self, now: Moment) -> Duration {
        let h = now.0 / HOUR_MS;
        let week = ((h / 24 + 3) % 7 * 24 + h % 24) as usize;
        let learned = self.state.keep_alive_week[week].or(self.state.keep_alive_day[(h % 24) as usize]);
        // Deleting an instance sooner than one lead time after it fell idle never pays: a
        // replacement costs at least that (the ski-rental break-even).
        let max = self.settings.max_idle_time;
        let min = self.settings.min_idle_time.max(self.lead_time()).min(max);
        match learned {
            None => max,
            Some(q) if q > max.as_secs_f64() => min,
            Some(q) => Duration::from_secs_f64(q).clamp(min, max),
        }
    }

    /// When the forecast next looks at a new slot: the next slot start less the lead time.
    pub fn next_change(&self, now: Moment) -> Moment {
        let slot_ms = self.slot_ms;
        let lead_ms = u64::try_from(self.lead_time().as_millis()).unwrap_or(u64::MAX);
        let mut next = (now.0.saturating_add(lead_ms) / slot_ms + 1) * slot_ms;
        next = next.saturating_sub(lead_ms);
        let next_hour = (now.0 / HOUR_MS + 1) * HOUR_MS;
        Moment(next.max(now.0 + 1).min(next_hour))
    }

    /// Slots in use at the last observation.
    pub fn in_use(&self) -> u32 {
        self.in_use
    }
}

/// Which learned rise a forecast reads.
#[derive(Clone, Copy, Debug)]
enum Series {
    /// Within one lead time (the idle target).
    Lead,
    /// Within `release_horizon` (the scale-down level).
    Long,
}

impl Series {
    fn of(self, record: &DayRecord) -> &[u16] {
        match self {
            Series::Lead => &record.rise,
            Series::Long => &record.rise_long,
        }
    }
}

/// Push `in_use` at `now` into the sliding minimum `window` of width `width` and return the
/// rise above that minimum.
fn sliding_rise(window: &mut VecDeque<(Moment, u32)>, now: Moment, width: Duration, in_use: u32) -> u16 {
    while window.front().is_some_and(|(t, _)| t.plus(width) < now) {
        window.pop_front();
    }
    while window.back().is_some_and(|(_, v)| *v >= in_use) {
        window.pop_back();
    }
    window.push_back((now, in_use));
    let floor = window.front().map_or(in_use, |(_, v)| *v);
    u16::try_from(in_use - floor).unwrap_or(u16::MAX)
}

#[cfg(test)]
#[path = "predictive_tests.rs"]
mod tests;
