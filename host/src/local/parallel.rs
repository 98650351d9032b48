//! `parallel:` of `runway exec`: `parallel: N` and `parallel: matrix` expanded into concrete
//! jobs with GitLab's names and `CI_NODE_*` variables, within GitLab's limit of 200 jobs per job,
//! counted before anything is built.
//!
//! Owns the expansion only; rules, variables and payloads are the parent module's.

use serde_yaml::{Mapping, Value};

use super::source::{list_of_strings, str_key, Sources};
use crate::config::ConfigError;

/// Most jobs one job's `parallel` may create, `parallel: N` or `parallel: matrix` (GitLab's
/// `Entry::Product::Parallel::PARALLEL_LIMIT`).
pub const PARALLEL_LIMIT: usize = 200;

/// One concrete job before rules: name, config and extra variables (parallel).
pub(super) struct Expanded {
    pub(super) name: String,
    pub(super) base: String,
    pub(super) config: Mapping,
    pub(super) extra: Vec<(String, String)>,
}

pub(super) fn expand_parallel(name: &str, config: &Mapping, sources: &Sources) -> Result<Vec<Expanded>, ConfigError> {
    let one =
        || vec![Expanded { name: name.to_string(), base: name.to_string(), config: config.clone(), extra: Vec::new() }];
    let Some(parallel) = config.get("parallel") else { return Ok(one()) };
    if let Some(n) = parallel.as_u64() {
        if !(1..=PARALLEL_LIMIT as u64).contains(&n) {
            return Err(sources.error(name, Some("parallel"), format!("must be between 1 and {PARALLEL_LIMIT}")));
        }
        return Ok((1..=n)
            .map(|i| Expanded {
                name: format!("{name} {i}/{n}"),
                base: name.to_string(),
                config: config.clone(),
                extra: vec![("CI_NODE_INDEX".into(), i.to_string()), ("CI_NODE_TOTAL".into(), n.to_string())],
            })
            .collect());
    }
    let Some(Value::Sequence(matrix)) = parallel.get("matrix") else {
        return Err(sources.error(name, Some("parallel"), "must be a number or {matrix: [...]}"));
    };
    // Count first (saturating), so a 1000 × 1000 matrix is refused before anything is built.
    let mut count: usize = 0;
    for entry in matrix {
        let Value::Mapping(entry) = entry else {
            return Err(sources.error(name, Some("parallel"), "matrix entries must be maps"));
        };
        let mut product: usize = 1;
        for (k, v) in entry {
            let values = match v {
                Value::Sequence(items) => items.len(),
                Value::Mapping(_) | Value::Tagged(_) => {
                    let key = str_key(k).unwrap_or_default();
                    return Err(sources.error(
                        name,
                        Some("parallel"),
                        format!("matrix variable {key} must be a string or an array of strings"),
                    ));
                }
                _ => 1,
            };
            product = product.saturating_mul(values);
        }
        count = count.saturating_add(product);
    }
    if count > PARALLEL_LIMIT {
        let shown = if count == usize::MAX { "more than usize::MAX".to_string() } else { count.to_string() };
        return Err(sources.error(
            name,
            Some("parallel"),
            format!("matrix config generates too many jobs ({shown}; maximum is {PARALLEL_LIMIT})"),
        ));
    }
    let mut combos: Vec<Vec<(String, String)>> = Vec::with_capacity(count);
    for entry in matrix {
        let Value::Mapping(entry) = entry else {
            return Err(sources.error(name, Some("parallel"), "matrix entries must be maps"));
        };
        let mut partial: Vec<Vec<(String, String)>> = vec![Vec::new()];
        for (k, v) in entry {
            let key = str_key(k).unwrap_or_default().to_string();
            let values = list_of_strings(v);
            let mut next = Vec::new();
            for p in &partial {
                for val in &values {
                    let mut q = p.clone();
                    q.push((key.clone(), val.clone()));
                    next.push(q);
                }
            }
            partial = next;
        }
        combos.extend(partial);
    }
    let total = combos.len();
    Ok(combos
        .into_iter()
        .enumerate()
        .map(|(i, vars)| {
            let label = vars.iter().map(|(_, v)| v.as_str()).collect::<Vec<_>>().join(", ");
            let mut extra = vars.clone();
            extra.push(("CI_NODE_INDEX".into(), (i + 1).to_string()));
            extra.push(("CI_NODE_TOTAL".into(), total.to_string()));
            Expanded { name: format!("{name}: [{label}]"), base: name.to_string(), config: config.clone(), extra }
        })
        .collect())
}
