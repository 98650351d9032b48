//! A job whose payload cannot be used (it does not decode, or its secrets cannot be masked):
//! accepted, its log only the error, failed with `runner_system_failure` — never left running
//! until GitLab's timeout. It holds no capacity and runs nothing.
//!
//! Owns: [`fail`]. Must not touch: the teardown (`super::Received::end`).

use std::sync::Arc;

use super::{Ending, GitLabSide, JobContext, Received};
use crate::gitlab::api::JobApi;
use crate::gitlab::client::BadJob;
use crate::job::{fail_unplannable, JobControl};
use crate::trace::{JobTrace, TraceOptions};

/// Fail `bad` at GitLab with a trace saying why.
pub(crate) async fn fail(ctx: JobContext, bad: BadJob) {
    let api: Arc<dyn JobApi> = match ctx.job_client(bad.id, &bad.token) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            tracing::error!(job = bad.id, "cannot report bad job payload: {e}");
            return;
        }
    };
    tracing::error!(job = bad.id, "{}", bad.error);
    let Ok(trace) = JobTrace::new(&TraceOptions {
        masked_phrases: vec![bad.token.clone()],
        token_prefixes: Vec::new(),
        output_limit_kib: ctx.output_limit_kib,
        timestamps: true,
        only_personal_tokens: false,
    }) else {
        return;
    };
    let side = GitLabSide::new(api, trace.clone(), JobControl::default(), ctx.retry(), ctx.upload.clone());
    let outcome = fail_unplannable(&trace, &ctx.env.identity, &bad.error);
    let received = Received::new(bad.id, bad.failure_reasons, side, None, None);
    received.end(Ending::Reported(outcome, None)).await;
}
