//! Cron period matching for idle policies. `[[runners.autoscaler.policy]] periods` are 5-field
//! unix expressions (`min hour dom mon dow`); the legacy `[[runners.machine.autoscaling]]
//! Periods` are read as gitlab-runner's cronexpr reads them: 7 fields (`sec min hour dom mon dow
//! year`), or 6 (`min hour dom mon dow year`) and 5 (`min hour dom mon dow`) with the second 0. An expression describes a
//! *time range*: a policy is active while the current wall time (in the policy's timezone)
//! matches. Supports `*`, numbers, names (`jan`, `mon`), ranges `a-b`, steps `*/n`, `a-b/n`,
//! `a/n` and lists; day-of-week 0 and 7 are Sunday; when both day-of-month and day-of-week are
//! restricted, either may match (classic cron).

use chrono::{DateTime, Datelike, Timelike, Utc};

/// Whether the expression has 5 fields (taskscaler) or seconds-and-year fields (Docker Machine).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CronDialect {
    /// `min hour dom mon dow`.
    Unix,
    /// `sec min hour dom mon dow [year]`.
    WithSeconds,
}

/// One allowed-values set for a field, as a bitmap over `min..=max`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FieldSet {
    min: u32,
    allowed: Vec<bool>,
    restricted: bool,
}

impl FieldSet {
    fn matches(&self, value: u32) -> bool {
        value >= self.min && self.allowed.get((value - self.min) as usize).copied().unwrap_or(false)
    }
}

/// A parsed cron expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CronPeriod {
    second: Option<FieldSet>,
    minute: FieldSet,
    hour: FieldSet,
    day_of_month: FieldSet,
    month: FieldSet,
    day_of_week: FieldSet,
    year: Option<FieldSet>,
}

const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// One field of a cron period that does not parse (the period's error names the expression).
#[derive(Debug)]
struct FieldError(String);

fn parse_value(text: &str, names: &[&str], name_base: u32) -> Result<u32, FieldError> {
    if let Ok(n) = text.parse::<u32>() {
        return Ok(n);
    }
    let lower = text.to_ascii_lowercase();
    names.iter().position(|n| *n == lower).map(|i| i as u32 + name_base).ok_or_else(|| {
        FieldError(format!("{text:?} is not a number{}", if names.is_empty() { "" } else { " or a name" }))
    })
}

fn parse_field(
    text: &str,
    min: u32,
    max: u32,
    names: &[&str],
    name_base: u32,
    what: &str,
) -> Result<FieldSet, FieldError> {
    let mut allowed = vec![false; (max - min + 1) as usize];
    let mut restricted = true;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => {
                let step: u32 =
                    step.parse().map_err(|_| FieldError(format!("{what}: step {step:?} is not a number")))?;
                if step == 0 {
                    return Err(FieldError(format!("{what}: step must be at least 1")));
                }
                (range, step)
            }
            None => (part, 1),
        };
        let (lo, hi) = if range == "*" || range == "?" {
            if step == 1 {
                restricted = restricted && text != "*" && text != "?";
            }
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (parse_value(a, names, name_base)?, parse_value(b, names, name_base)?)
        } else {
            let start = parse_value(range, names, name_base)?;
            // `a/n` means "from a to the end, every n".
            (start, if part.contains('/') { max } else { start })
        };
        if lo < min || hi > max || lo > hi {
            return Err(FieldError(format!("{what}: {range:?} is outside {min}-{max}")));
        }
        let mut v = lo;
        while v <= hi {
            allowed[(v - min) as usize] = true;
            v += step;
        }
    }
    Ok(FieldSet { min, allowed, restricted })
}

/// A cron period or policy timezone that does not parse; the message names the text and what
/// is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    /// A cron expression with the wrong number of fields or a bad field.
    #[error("{0}")]
    Period(String),
    /// A timezone that is not an IANA name.
    #[error("{0}")]
    Timezone(String),
}

impl CronPeriod {
    /// Parse an expression of the given dialect. Errors say which field is wrong.
    pub fn parse(expr: &str, dialect: CronDialect) -> Result<CronPeriod, CronError> {
        let mut fields: Vec<&str> = expr.split_whitespace().collect();
        if dialect == CronDialect::WithSeconds && matches!(fields.len(), 5 | 6) {
            // gitlab-runner's cronexpr: without a seconds field the second is 0 (`min hour dom
            // mon dow [year]`), the year any when it is left out too.
            fields.insert(0, "0");
            if fields.len() == 6 {
                fields.push("*");
            }
        }
        let (second, rest, year) = match dialect {
            CronDialect::Unix => {
                if fields.len() != 5 {
                    return Err(CronError::Period(format!(
                        "cron period {expr:?} must have 5 fields (min hour dom mon dow), found {}",
                        fields.len()
                    )));
                }
                (None, &fields[..], None)
            }
            CronDialect::WithSeconds => {
                if !(5..=7).contains(&fields.len()) {
                    return Err(CronError::Period(format!(
                        "cron period {expr:?} must have 7 fields (sec min hour dom mon dow year), or 6 or 5 \
                         without the seconds (and the year), found {}",
                        fields.len()
                    )));
                }
                let year = match fields.get(6) {
                    Some(y) => Some(parse_field(y, 1970, 2199, &[], 0, "year").map_err(|e| CronError::Period(e.0))?),
                    None => None,
                };
                (
                    Some(parse_field(fields[0], 0, 59, &[], 0, "second").map_err(|e| CronError::Period(e.0))?),
                    &fields[1..6],
                    year,
                )
            }
        };
        let wrap = |e: FieldError| CronError::Period(format!("cron period {expr:?}: {}", e.0));
        let mut day_of_week = parse_field(rest[4], 0, 7, &WEEKDAYS, 0, "day of week").map_err(wrap)?;
        if day_of_week.allowed[7] {
            day_of_week.allowed[0] = true;
        }
        Ok(CronPeriod {
            second,
            minute: parse_field(rest[0], 0, 59, &[], 0, "minute").map_err(wrap)?,
            hour: parse_field(rest[1], 0, 23, &[], 0, "hour").map_err(wrap)?,
            day_of_month: parse_field(rest[2], 1, 31, &[], 0, "day of month").map_err(wrap)?,
            month: parse_field(rest[3], 1, 12, &MONTHS, 1, "month").map_err(wrap)?,
            day_of_week,
            year,
        })
    }

    /// Whether the wall time `at` (already converted to the policy's timezone) is in range.
    pub fn matches<Tz: chrono::TimeZone>(&self, at: &DateTime<Tz>) -> bool {
        if let Some(second) = &self.second {
            if !second.matches(at.second()) {
                return false;
            }
        }
        if let Some(year) = &self.year {
            if at.year() < 0 || !year.matches(at.year() as u32) {
                return false;
            }
        }
        let dom = self.day_of_month.matches(at.day());
        let dow = self.day_of_week.matches(at.weekday().num_days_from_sunday());
        let day = match (self.day_of_month.restricted, self.day_of_week.restricted) {
            (true, true) => dom || dow,
            _ => dom && dow,
        };
        day && self.minute.matches(at.minute()) && self.hour.matches(at.hour()) && self.month.matches(at.month())
    }
}

/// A policy's timezone: a named IANA zone, or the manager's local time.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicyZone {
    /// The host's local timezone (GitLab's default when `timezone` is unset).
    Local,
    /// A named zone such as `Europe/Berlin` or `UTC`.
    Named(chrono_tz::Tz),
}

impl PolicyZone {
    /// Parse `timezone`; `None` or `""` or `"Local"` is local time.
    pub fn parse(name: Option<&str>) -> Result<PolicyZone, CronError> {
        match name.map(str::trim) {
            None | Some("") | Some("Local") | Some("local") => Ok(PolicyZone::Local),
            Some(name) => name.parse::<chrono_tz::Tz>().map(PolicyZone::Named).map_err(|_| {
                CronError::Timezone(format!(
                    "unknown timezone {name:?} (use an IANA name like \"Europe/Berlin\" or \"UTC\")"
                ))
            }),
        }
    }

    /// Whether any of `periods` matches `at` in this zone.
    pub fn any_matches(&self, periods: &[CronPeriod], at: DateTime<Utc>) -> bool {
        match self {
            PolicyZone::Local => {
                let local = at.with_timezone(&chrono::Local);
                periods.iter().any(|p| p.matches(&local))
            }
            PolicyZone::Named(tz) => {
                let zoned = at.with_timezone(tz);
                periods.iter().any(|p| p.matches(&zoned))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).single().expect("valid date")
    }

    #[test]
    fn office_hours_match_weekdays_only() {
        let p = CronPeriod::parse("* 8-18 * * mon-fri", CronDialect::Unix).expect("parses");
        assert!(p.matches(&utc(2026, 1, 5, 8, 0, 0)), "Monday 08:00");
        assert!(p.matches(&utc(2026, 1, 9, 18, 59, 0)), "Friday 18:59");
        assert!(!p.matches(&utc(2026, 1, 9, 19, 0, 0)), "Friday 19:00");
        assert!(!p.matches(&utc(2026, 1, 10, 10, 0, 0)), "Saturday");
    }

    #[test]
    fn steps_lists_and_sunday_as_seven() {
        let p = CronPeriod::parse("*/15 0,12 * * 7", CronDialect::Unix).expect("parses");
        assert!(p.matches(&utc(2026, 1, 4, 12, 30, 0)), "Sunday 12:30");
        assert!(!p.matches(&utc(2026, 1, 4, 12, 31, 0)));
        assert!(!p.matches(&utc(2026, 1, 5, 12, 30, 0)), "Monday");
    }

    #[test]
    fn legacy_dialect_has_seconds_and_year() {
        let p = CronPeriod::parse("* * 9-17 * * mon-fri 2026", CronDialect::WithSeconds).expect("parses");
        assert!(p.matches(&utc(2026, 1, 5, 9, 0, 7)));
        assert!(!p.matches(&utc(2027, 1, 4, 9, 0, 7)), "other year");
        assert!(CronPeriod::parse("* * * *", CronDialect::WithSeconds).is_err());
        // cronexpr: six fields are `min hour dom mon dow year`, five `min hour dom mon dow`,
        // both at second 0 — active only in each minute's first second, as in gitlab-runner.
        let six = CronPeriod::parse("* 9-17 * * mon-fri 2026", CronDialect::WithSeconds).expect("parses");
        assert!(six.matches(&utc(2026, 1, 5, 9, 30, 0)));
        assert!(!six.matches(&utc(2026, 1, 5, 9, 30, 7)), "second 0 only");
        assert!(!six.matches(&utc(2027, 1, 4, 9, 30, 0)), "the sixth field is the year");
        let five = CronPeriod::parse("* 9-17 * * mon-fri", CronDialect::WithSeconds).expect("parses");
        assert!(five.matches(&utc(2027, 1, 4, 9, 30, 0)) && !five.matches(&utc(2027, 1, 4, 9, 30, 1)));
    }

    #[test]
    fn day_of_month_or_day_of_week_when_both_restricted() {
        let p = CronPeriod::parse("* * 1 * mon", CronDialect::Unix).expect("parses");
        assert!(p.matches(&utc(2026, 1, 1, 0, 0, 0)), "the 1st (a Thursday)");
        assert!(p.matches(&utc(2026, 1, 5, 0, 0, 0)), "a Monday");
        assert!(!p.matches(&utc(2026, 1, 6, 0, 0, 0)));
    }

    #[test]
    fn bad_expressions_name_the_field() {
        let err = CronPeriod::parse("* 25 * * *", CronDialect::Unix).expect_err("hour 25").to_string();
        assert!(err.contains("hour"), "{err}");
        assert!(CronPeriod::parse("* * * *", CronDialect::Unix).is_err());
        assert!(PolicyZone::parse(Some("Mars/Olympus")).is_err());
    }

    #[test]
    fn timezone_shifts_the_match() {
        let p = [CronPeriod::parse("* 9 * * *", CronDialect::Unix).expect("parses")];
        let berlin = PolicyZone::parse(Some("Europe/Berlin")).expect("zone");
        assert!(berlin.any_matches(&p, utc(2026, 1, 5, 8, 30, 0)), "08:30 UTC is 09:30 in Berlin in winter");
        assert!(!berlin.any_matches(&p, utc(2026, 1, 5, 9, 30, 0)));
    }
}
