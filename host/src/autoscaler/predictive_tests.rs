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
    assert!(s.validate().expect_err("range").contains("headroom_quantile"));
    let s = PredictiveSettings { min_idle_time: Duration::from_secs(3600), ..Default::default() };
    assert!(s.validate().expect_err("order").contains("min_idle_time"));
}
