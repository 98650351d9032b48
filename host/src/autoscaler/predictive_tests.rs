//! Unit tests of the predictive policy's forecaster.

use super::*;

/// Monday 2026-01-05 00:00 UTC (the traces' start).
const MONDAY: u64 = 1_767_571_200_000;

fn at(day: u64, hour: u64, minute: u64, second: u64) -> Moment {
    Moment(MONDAY + day * DAY_MS + hour * HOUR_MS + minute * 60_000 + second * 1000)
}

fn fixed_lead() -> PredictiveSettings {
    PredictiveSettings { lead_time: Some(Duration::from_secs(90)), ..Default::default() }
}

/// Feed a day with a quiet fleet and a burst of `burst` jobs at 04:00 lasting ten minutes.
fn burst_day(p: &mut Predictor, day: u64, burst: u32) {
    let mut t = at(day, 0, 0, 0);
    while t < at(day + 1, 0, 0, 0) {
        let in_use = if t >= at(day, 4, 0, 0) && t < at(day, 4, 10, 0) { burst } else { 1 };
        if t == at(day, 4, 0, 0) {
            for _ in 0..burst {
                p.observe_arrival(t);
            }
        }
        p.observe_in_use(t, in_use);
        t = t.plus(Duration::from_secs(30));
    }
}

#[test]
fn a_daily_burst_is_pre_warmed_one_lead_time_ahead() {
    let mut p = Predictor::new(fixed_lead(), None);
    for day in 0..3 {
        burst_day(&mut p, day, 400);
    }
    // Day 3 (Thursday): no past Thursday yet, so the past weekdays stand in.
    assert!(p.idle_target(at(3, 3, 50, 0)) < 5, "no burst expected ten minutes before");
    let before = p.idle_target(at(3, 3, 58, 40));
    assert!(before >= 399, "a lead time before 04:00 the burst is provisioned: {before}");
    // Once the burst arrived, the slot's forecast is spent: nothing more is added for it.
    p.observe_in_use(at(3, 3, 59, 0), 1);
    for _ in 0..400 {
        p.observe_arrival(at(3, 4, 0, 0));
    }
    p.observe_in_use(at(3, 4, 0, 0), 401);
    p.observe_in_use(at(3, 4, 2, 0), 401);
    let after = p.idle_target(at(3, 4, 2, 0));
    assert!(after < 400, "the burst is not provisioned twice: {after}");
}

#[test]
fn weekends_are_forecast_from_weekends() {
    let mut p = Predictor::new(fixed_lead(), None);
    for day in 0..5 {
        burst_day(&mut p, day, 200);
    }
    // Saturday: no weekend in the history, so no burst is forecast from the weekdays.
    burst_day(&mut p, 5, 0);
    assert!(p.idle_target(at(5, 3, 58, 40)) < 5);
}

#[test]
fn keep_alive_follows_the_gaps_of_each_hour() {
    let settings = PredictiveSettings { keep_alive_quantile: 0.9, ..fixed_lead() };
    let mut p = Predictor::new(settings, None);
    // 10:00–11:00 arrivals every 2 minutes; 02:00–03:00 every 40 minutes (out of bounds).
    for minute in (0..60).step_by(2) {
        p.observe_arrival(at(0, 10, minute, 0));
    }
    p.observe_arrival(at(0, 11, 0, 0));
    for day in 1..3 {
        p.observe_arrival(at(day, 2, 0, 0));
        p.observe_arrival(at(day, 2, 40, 0));
        p.observe_arrival(at(day, 3, 20, 0));
    }
    p.observe_arrival(at(0, 2, 0, 0).plus(Duration::from_secs(7 * 86_400)));
    let day_keep = p.keep_alive(at(7, 10, 30, 0));
    assert_eq!(day_keep, Duration::from_secs(120), "the hour's 90th percentile gap");
    assert_eq!(p.keep_alive(at(8, 2, 30, 0)), Duration::from_secs(90), "out of bounds: the minimum, one lead time");
    assert_eq!(p.keep_alive(at(8, 20, 30, 0)), Duration::from_secs(20 * 60), "unknown hour: the maximum");
}

#[test]
fn lead_time_is_learned_from_instances() {
    let mut p = Predictor::new(PredictiveSettings::default(), None);
    assert_eq!(p.lead_time(), Duration::from_secs(90), "default before any instance");
    for i in 0..10 {
        p.observe_lead(Moment(0), Moment(40_000 + i * 1000));
    }
    assert_eq!(p.lead_time(), Duration::from_secs(48), "p90 of 40..49 s");
}

#[test]
fn learned_state_survives_a_round_trip() {
    let mut p = Predictor::new(fixed_lead(), None);
    for day in 0..3 {
        burst_day(&mut p, day, 300);
    }
    let json = serde_json::to_string(p.state()).expect("serialise");
    let restored: PredictorState = serde_json::from_str(&json).expect("parse");
    let q = Predictor::new(fixed_lead(), Some(restored));
    let t = at(3, 3, 58, 40);
    assert_eq!(q.idle_target(t), p.idle_target(t));
    assert!(q.idle_target(t) >= 299);
}

#[test]
fn invalid_settings_name_the_key() {
    let s = PredictiveSettings { headroom_quantile: 1.5, ..Default::default() };
    assert!(s.validate().expect_err("range").0.contains("headroom_quantile"));
    let s = PredictiveSettings { min_idle_time: Duration::from_secs(3600), ..Default::default() };
    assert!(s.validate().expect_err("order").0.contains("min_idle_time"));
}

#[test]
fn history_saved_before_slot_length_existed_reads_as_five_minute_slots() {
    let state: PredictorState = serde_json::from_str(
        r#"{"days":[{"day":3,"rise":[1,2]}],"lead_samples":[],"keep_alive_week":[],"keep_alive_day":[]}"#,
    )
    .expect("old format");
    assert_eq!(state.slot_secs, 300);
    let p = Predictor::new(PredictiveSettings::default(), Some(state));
    assert_eq!(p.state().days.len(), 1, "kept at the default width");
    assert_eq!(p.state().days[0].rise.len(), 288);
}

#[test]
fn slot_length_must_divide_a_day() {
    for bad in
        [Duration::from_secs(7), Duration::from_millis(20_500), Duration::from_secs(7 * 60), Duration::from_secs(7200)]
    {
        let s = PredictiveSettings { slot_length: bad, ..Default::default() };
        assert!(s.validate().expect_err("slot").0.contains("slot_length"), "{bad:?}");
    }
    let s = PredictiveSettings { slot_length: Duration::from_secs(20), ..Default::default() };
    assert_eq!(s.validate(), Ok(()));
}

#[test]
fn a_short_slot_forecasts_at_its_own_granularity_and_drops_history_of_another_width() {
    let settings = PredictiveSettings {
        slot_length: Duration::from_secs(20),
        lead_time: Some(Duration::from_secs(20)),
        ..Default::default()
    };
    // A week ago, 3 slots rose at 10:00:40 (slot 1802 of 4320).
    let mut rise = vec![0u16; 4320];
    rise[10 * 180 + 2] = 3;
    let state = PredictorState {
        slot_secs: 20,
        days: [DayRecord { day: 19_363, rise, rise_long: Vec::new() }].into(),
        ..Default::default()
    };
    let p = Predictor::new(settings.clone(), Some(state.clone()));
    let today = |h: u64, m: u64, s: u64| Moment((19_363 + 7) * DAY_MS + h * HOUR_MS + m * 60_000 + s * 1000);
    assert_eq!(p.idle_target(today(10, 0, 0)), 0, "40 s ahead: beyond one lead time");
    assert_eq!(p.idle_target(today(10, 0, 25)), 3, "the burst's slot is within one lead time");
    assert_eq!(p.idle_target(today(10, 1, 0)), 0, "after the burst's slot");
    assert_eq!(p.next_change(today(10, 0, 0)), today(10, 0, 20), "wakes one lead time before the next slot");

    let other = PredictiveSettings { slot_length: Duration::from_secs(60), ..settings };
    let q = Predictor::new(other, Some(state));
    assert!(q.state().days.is_empty(), "20 s history is not read as 60 s slots");
    assert_eq!(q.state().slot_secs, 60);
}

#[test]
fn a_rise_seen_on_fewer_past_days_than_min_recurrence_is_not_pre_warmed() {
    let once = |min_recurrence| {
        let mut p = Predictor::new(PredictiveSettings { min_recurrence, ..fixed_lead() }, None);
        burst_day(&mut p, 0, 400);
        burst_day(&mut p, 1, 0);
        p.idle_target(at(2, 3, 58, 40))
    };
    // Two past weekdays: the 0.8 quantile of {0, 400} is the burst.
    assert!(once(1) >= 399, "min_recurrence 1: a burst seen once is pre-warmed");
    assert!(once(2) < 5, "min_recurrence 2: a burst seen on one day only is not");
    let mut p = Predictor::new(PredictiveSettings { min_recurrence: 2, ..fixed_lead() }, None);
    burst_day(&mut p, 0, 400);
    burst_day(&mut p, 1, 400);
    assert!(p.idle_target(at(2, 3, 58, 40)) >= 399, "seen on two days: pre-warmed");
    let bad = PredictiveSettings { min_recurrence: 0, ..Default::default() };
    assert!(bad.validate().expect_err("zero").0.contains("min_recurrence"));
}

#[test]
fn release_horizon_learns_the_rise_within_it_and_is_off_by_default() {
    let mut off = Predictor::new(fixed_lead(), None);
    burst_day(&mut off, 0, 400);
    assert_eq!(off.keep_level(at(1, 3, 55, 0)), None);
    assert!(off.state().days.iter().all(|d| d.rise_long.is_empty()), "no second history when off");

    let settings = PredictiveSettings { release_horizon: Some(Duration::from_secs(600)), ..fixed_lead() };
    let mut p = Predictor::new(settings, None);
    for day in 0..3 {
        burst_day(&mut p, day, 400);
    }
    // Five minutes before the burst, its slot lies within the horizon: keep that many.
    assert!(p.keep_level(at(3, 3, 55, 0)).is_some_and(|k| k >= 399), "{:?}", p.keep_level(at(3, 3, 55, 0)));
    // Just after it (in use falls back at 04:10): no rise is expected, nothing idle is worth keeping.
    assert_eq!(p.keep_level(at(3, 4, 12, 0)), Some(0));
    assert_eq!(p.keep_level(at(3, 10, 0, 0)), Some(0));
    for bad in [Duration::ZERO, Duration::from_secs(86_401)] {
        let s = PredictiveSettings { release_horizon: Some(bad), ..Default::default() };
        assert!(s.validate().expect_err("range").0.contains("release_horizon"), "{bad:?}");
    }
}

#[test]
fn history_learned_without_release_horizon_is_not_read_as_no_rise() {
    let mut p = Predictor::new(fixed_lead(), None);
    for day in 0..3 {
        burst_day(&mut p, day, 400);
    }
    let settings = PredictiveSettings { release_horizon: Some(Duration::from_secs(600)), ..fixed_lead() };
    let mut p = Predictor::new(settings, Some(p.state().clone()));
    assert!(p.state().days.iter().all(|d| d.rise_long.is_empty()), "no profile invented for old days");
    // Day 3: a rise of 30 at 02:00. Without learned days the last hour of today stands in,
    // as on a fresh start (old days padded with zeros would say "no rise" for weeks).
    let mut t = at(3, 0, 0, 0);
    while t <= at(3, 2, 20, 0) {
        p.observe_in_use(t, if t >= at(3, 2, 0, 0) { 31 } else { 1 });
        t = t.plus(Duration::from_secs(30));
    }
    assert!(p.keep_level(at(3, 2, 20, 0)).is_some_and(|k| k >= 30), "{:?}", p.keep_level(at(3, 2, 20, 0)));
}
