//! Streaming sanitizers for the job log, chained in GitLab Runner's order (§3.5): phrase masker
//! (masked variable values) → URL-parameter sanitizer → token-prefix sanitizer.
//!
//! Every stage is streaming-safe: a secret split across two `push` calls is still masked. A
//! stage holds back only the bytes that could still be the start of a match (the longest
//! partial-match suffix); [`Masker::flush`] releases them at the end of the job.

use aho_corasick::{AhoCorasick, MatchKind};

/// What replaces a secret in the log.
pub const MASK: &[u8] = b"[MASKED]";

/// Token prefixes masked on every job (GitLab's defaults with `FF_MASK_ALL_DEFAULT_TOKENS` on).
pub const DEFAULT_TOKEN_PREFIXES: [&str; 14] = [
    "glpat-",
    "gloas-",
    "gldt-",
    "glrt-",
    "glcbt-",
    "glrtr-",
    "glptt-",
    "glft-",
    "glimt-",
    "glagent-",
    "glsoat-",
    "glffct-",
    "_gitlab_session=",
    "gltok-",
];

/// The default prefixes masked in every job: all of GitLab's with `FF_MASK_ALL_DEFAULT_TOKENS`
/// (on by default), only `glpat-` without, as gitlab-runner.
pub fn default_token_prefixes(mask_all: bool) -> &'static [&'static str] {
    if mask_all {
        &DEFAULT_TOKEN_PREFIXES
    } else {
        &DEFAULT_TOKEN_PREFIXES[..1]
    }
}

/// GitLab Runner honours at most this many token prefixes; the rest are ignored.
pub const MAX_TOKEN_PREFIXES: usize = 15;

/// Query parameters whose values are masked (keys compared case-insensitively).
pub const SENSITIVE_URL_PARAMS: [&str; 6] =
    ["private_token", "authenticity_token", "rss_token", "x-amz-signature", "x-amz-credential", "x-amz-security-token"];

/// The masking patterns could not be compiled (too many or too large for the matcher).
#[derive(Debug, thiserror::Error)]
#[error("cannot build the trace masker for {what}: {source}")]
pub struct MaskError {
    what: &'static str,
    #[source]
    source: aho_corasick::BuildError,
}

/// A set of byte patterns matched leftmost-longest, with the "could this tail still grow into
/// a match?" question answered for streaming.
struct PatternSet {
    matcher: AhoCorasick,
    /// The patterns sorted, to find patterns having a given prefix by binary search.
    sorted: Vec<Vec<u8>>,
    longest: usize,
    /// Bytes some pattern starts with: a tail starting elsewhere cannot be a partial match.
    first_bytes: [bool; 256],
}

impl PatternSet {
    fn new(patterns: Vec<Vec<u8>>, what: &'static str) -> Result<Option<Self>, MaskError> {
        if patterns.is_empty() {
            return Ok(None);
        }
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .map_err(|source| MaskError { what, source })?;
        let longest = patterns.iter().map(Vec::len).max().unwrap_or(0);
        let mut first_bytes = [false; 256];
        for first in patterns.iter().filter_map(|p| p.first()) {
            first_bytes[usize::from(*first)] = true;
        }
        let mut sorted = patterns;
        sorted.sort();
        Ok(Some(PatternSet { matcher, sorted, longest, first_bytes }))
    }

    /// Whether `tail` is a proper prefix of some pattern (more bytes could complete a match).
    fn is_proper_prefix(&self, tail: &[u8]) -> bool {
        let first = self.sorted.partition_point(|p| p.as_slice() < tail);
        // Patterns starting with `tail` are contiguous from `first`; the shortest (possibly
        // `tail` itself) sorts first, so looking at two of them is enough.
        self.sorted[first..].iter().take(2).any(|p| p.len() > tail.len() && p.starts_with(tail))
    }

    /// The earliest index `>= from` where `buf[index..]` could still grow into a match;
    /// `buf.len()` when none can.
    fn partial_match_start(&self, buf: &[u8], from: usize) -> usize {
        let lower = from.max(buf.len().saturating_sub(self.longest.saturating_sub(1)));
        (lower..buf.len())
            .find(|&i| self.first_bytes[usize::from(buf[i])] && self.is_proper_prefix(&buf[i..]))
            .unwrap_or(buf.len())
    }
}

/// Replaces every masked phrase with `[MASKED]`.
pub struct PhraseMasker {
    patterns: Option<PatternSet>,
    pending: Vec<u8>,
}

impl PhraseMasker {
    /// Phrases are deduplicated; empty ones are ignored.
    pub fn new<I, P>(phrases: I) -> Result<Self, MaskError>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<[u8]>,
    {
        let mut unique: Vec<Vec<u8>> = Vec::new();
        for phrase in phrases {
            let phrase = phrase.as_ref();
            if !phrase.is_empty() && !unique.iter().any(|p| p == phrase) {
                unique.push(phrase.to_vec());
            }
        }
        Ok(PhraseMasker { patterns: PatternSet::new(unique, "masked variables")?, pending: Vec::new() })
    }

    /// Mask `phrases` too from now on (values learnt while the job runs, such as its resolved
    /// `secrets:`); bytes held back stay held back.
    pub fn learn<I, P>(&mut self, phrases: I) -> Result<(), MaskError>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<[u8]>,
    {
        let known = self.patterns.as_ref().map(|p| p.sorted.clone()).unwrap_or_default();
        let pending = std::mem::take(&mut self.pending);
        let all = known.into_iter().chain(phrases.into_iter().map(|p| p.as_ref().to_vec()));
        *self = PhraseMasker { pending, ..PhraseMasker::new(all)? };
        Ok(())
    }

    /// Mask `input`, appending what is certain to `out` and holding back a possible partial match.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let Some(patterns) = &self.patterns else {
            out.extend_from_slice(input);
            return;
        };
        if self.pending.is_empty() {
            // Nothing held back (the usual case): scan the input where it is, keep its tail.
            let cut = mask_phrases(patterns, input, out);
            self.pending.extend_from_slice(&input[cut..]);
            return;
        }
        self.pending.extend_from_slice(input);
        let cut = mask_phrases(patterns, &self.pending, out);
        self.pending.drain(..cut);
    }

    /// Release everything held back (end of the stream).
    pub fn flush(&mut self, out: &mut Vec<u8>) {
        let pending = std::mem::take(&mut self.pending);
        match &self.patterns {
            Some(patterns) => {
                let mut pos = 0;
                for found in patterns.matcher.find_iter(&pending) {
                    out.extend_from_slice(&pending[pos..found.start()]);
                    out.extend_from_slice(MASK);
                    pos = found.end();
                }
                out.extend_from_slice(&pending[pos..]);
            }
            None => out.extend_from_slice(&pending),
        }
    }
}

/// Mask the phrases of `buf` into `out` up to where a match could still grow; returns that
/// index (the bytes from it on are held back).
fn mask_phrases(patterns: &PatternSet, buf: &[u8], out: &mut Vec<u8>) -> usize {
    let hold = patterns.partial_match_start(buf, 0);
    let mut pos = 0;
    for found in patterns.matcher.find_iter(buf) {
        // A match starting in the held tail might still grow; decide it later.
        if found.start() >= hold {
            break;
        }
        out.extend_from_slice(&buf[pos..found.start()]);
        out.extend_from_slice(MASK);
        pos = found.end();
    }
    let cut = pos.max(hold);
    out.extend_from_slice(&buf[pos..cut]);
    cut
}

/// Where the URL sanitizer is in its scan.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum UrlState {
    #[default]
    /// Looking for `?` or `&`.
    Scanning,
    /// After `?`/`&`: collecting a parameter name up to `=`.
    Key(Vec<u8>),
    /// Dropping a sensitive value until the parameter ends.
    Masking,
}

/// Replaces the values of sensitive query parameters (`?private_token=…`) with `[MASKED]`.
///
/// Nothing is held back: keys pass through unchanged as they arrive and a value being masked
/// is dropped byte by byte, so only the state crosses write boundaries.
pub struct UrlParamSanitizer {
    state: UrlState,
    longest_key: usize,
}

impl Default for UrlParamSanitizer {
    fn default() -> Self {
        let longest_key = SENSITIVE_URL_PARAMS.iter().map(|k| k.len()).max().unwrap_or(0);
        UrlParamSanitizer { state: UrlState::Scanning, longest_key }
    }
}

/// A parameter value ends at the next parameter, whitespace or a control character.
fn is_param_end(byte: u8) -> bool {
    byte == b'?' || byte == b'&' || byte.is_ascii_whitespace() || byte.is_ascii_control()
}

fn is_sensitive_param(key: &[u8]) -> bool {
    SENSITIVE_URL_PARAMS.iter().any(|k| k.as_bytes().eq_ignore_ascii_case(key))
}

impl UrlParamSanitizer {
    /// Sanitize `input`, appending the bytes that are final to `out` (a possible match at the end is held back).
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let mut pos = 0;
        while pos < input.len() {
            match &mut self.state {
                UrlState::Masking => match input[pos..].iter().position(|&b| is_param_end(b)) {
                    Some(offset) => {
                        out.extend_from_slice(MASK);
                        pos += offset;
                        self.state = UrlState::Scanning;
                    }
                    None => pos = input.len(),
                },
                UrlState::Scanning => match memchr::memchr2(b'?', b'&', &input[pos..]) {
                    Some(offset) => {
                        out.extend_from_slice(&input[pos..=pos + offset]);
                        pos += offset + 1;
                        self.state = UrlState::Key(Vec::new());
                    }
                    None => {
                        out.extend_from_slice(&input[pos..]);
                        pos = input.len();
                    }
                },
                UrlState::Key(key) => {
                    let byte = input[pos];
                    match byte {
                        b'?' | b'&' => {
                            out.push(byte);
                            key.clear();
                        }
                        b'=' => {
                            out.push(byte);
                            self.state = if is_sensitive_param(key) { UrlState::Masking } else { UrlState::Scanning };
                        }
                        _ if key.len() >= self.longest_key || is_param_end(byte) => {
                            // Cannot be one of ours: resume scanning at this byte.
                            self.state = UrlState::Scanning;
                            continue;
                        }
                        _ => {
                            out.push(byte);
                            key.push(byte);
                        }
                    }
                    pos += 1;
                }
            }
        }
    }

    /// End of stream: release every held-back byte.
    pub fn flush(&mut self, out: &mut Vec<u8>) {
        if self.state == UrlState::Masking {
            out.extend_from_slice(MASK);
        }
        self.state = UrlState::Scanning;
    }
}

/// Characters a prefixed token may contain after its prefix.
fn is_token_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'=')
}

/// Masks `<prefix>[A-Za-z0-9._=-]+` as `<prefix>[MASKED]`.
pub struct TokenPrefixSanitizer {
    patterns: Option<PatternSet>,
    pending: Vec<u8>,
    /// A prefix was just emitted; token bytes are being dropped.
    in_token: bool,
    /// At least one token byte was dropped since the prefix.
    token_dropped: bool,
}

impl TokenPrefixSanitizer {
    /// `job_prefixes` (the job's `features.token_mask_prefixes`) come first, then the
    /// defaults; duplicates and empty entries are skipped and at most
    /// [`MAX_TOKEN_PREFIXES`] are honoured.
    pub fn new(job_prefixes: &[String]) -> Result<Self, MaskError> {
        Self::with_defaults(job_prefixes, &DEFAULT_TOKEN_PREFIXES)
    }

    /// As [`TokenPrefixSanitizer::new`] with `defaults` after the job's prefixes
    /// ([`default_token_prefixes`]).
    pub fn with_defaults(job_prefixes: &[String], defaults: &[&str]) -> Result<Self, MaskError> {
        let mut prefixes: Vec<Vec<u8>> = Vec::new();
        let candidates = job_prefixes.iter().map(String::as_str).chain(defaults.iter().copied());
        for prefix in candidates {
            if prefixes.len() == MAX_TOKEN_PREFIXES {
                break;
            }
            if !prefix.is_empty() && !prefixes.iter().any(|p| p == prefix.as_bytes()) {
                prefixes.push(prefix.as_bytes().to_vec());
            }
        }
        Ok(TokenPrefixSanitizer {
            patterns: PatternSet::new(prefixes, "token prefixes")?,
            pending: Vec::new(),
            in_token: false,
            token_dropped: false,
        })
    }

    /// Sanitize `input`, appending the bytes that are final to `out` (a possible match at the end is held back).
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let Some(patterns) = &self.patterns else {
            out.extend_from_slice(input);
            return;
        };
        if self.pending.is_empty() {
            // Nothing held back (the usual case): scan the input where it is, keep its tail.
            let cut = mask_tokens(patterns, &mut self.in_token, &mut self.token_dropped, input, out);
            self.pending.extend_from_slice(&input[cut..]);
            return;
        }
        self.pending.extend_from_slice(input);
        let cut = mask_tokens(patterns, &mut self.in_token, &mut self.token_dropped, &self.pending, out);
        self.pending.drain(..cut);
    }

    /// End of stream: release every held-back byte.
    pub fn flush(&mut self, out: &mut Vec<u8>) {
        if self.in_token && self.token_dropped {
            out.extend_from_slice(MASK);
        }
        self.in_token = false;
        self.token_dropped = false;
        // Whatever is held is a partial prefix with nothing after it: nothing to mask.
        out.append(&mut self.pending);
    }
}

/// Mask the token values of `buf` into `out` (`in_token`/`token_dropped`: the
/// [`TokenPrefixSanitizer`]'s state); returns where the held-back tail starts.
fn mask_tokens(
    patterns: &PatternSet,
    in_token: &mut bool,
    token_dropped: &mut bool,
    buf: &[u8],
    out: &mut Vec<u8>,
) -> usize {
    let mut pos = 0;
    loop {
        if *in_token {
            let token_len = buf[pos..].iter().take_while(|&&b| is_token_byte(b)).count();
            pos += token_len;
            *token_dropped |= token_len > 0;
            if pos == buf.len() {
                break;
            }
            if *token_dropped {
                out.extend_from_slice(MASK);
            }
            *in_token = false;
            *token_dropped = false;
        }
        let hold = patterns.partial_match_start(buf, pos);
        match patterns.matcher.find(&buf[pos..]) {
            Some(found) if pos + found.start() < hold => {
                // Keep the prefix, drop what follows.
                out.extend_from_slice(&buf[pos..pos + found.end()]);
                pos += found.end();
                *in_token = true;
            }
            _ => {
                out.extend_from_slice(&buf[pos..hold]);
                pos = hold;
                break;
            }
        }
    }
    pos
}

/// What a [`Masker`] carries from one write to the next — bytes held back (possibly the start
/// of a secret) and where each scanner is — so that a job's log resumed after a restart is
/// masked exactly as it would have been without one. Holds fragments of secrets: store it
/// sealed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MaskerState {
    phrase_pending: Vec<u8>,
    url: UrlState,
    token_pending: Vec<u8>,
    in_token: bool,
    token_dropped: bool,
}

/// The whole chain: phrases → URL parameters → token prefixes.
pub struct Masker {
    phrases: PhraseMasker,
    url_params: UrlParamSanitizer,
    token_prefixes: TokenPrefixSanitizer,
    after_phrases: Vec<u8>,
    after_url_params: Vec<u8>,
}

impl Masker {
    /// `phrases`: values of the job's `masked` variables; `token_prefixes`: the job's
    /// `features.token_mask_prefixes` (defaults are always added).
    pub fn new<I, P>(phrases: I, token_prefixes: &[String]) -> Result<Self, MaskError>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<[u8]>,
    {
        Self::for_job(phrases, token_prefixes, true)
    }

    /// As [`Masker::new`], with only `glpat-` among the defaults unless `mask_all_default_tokens`
    /// (`FF_MASK_ALL_DEFAULT_TOKENS`).
    pub fn for_job<I, P>(
        phrases: I,
        token_prefixes: &[String],
        mask_all_default_tokens: bool,
    ) -> Result<Self, MaskError>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<[u8]>,
    {
        Ok(Masker {
            phrases: PhraseMasker::new(phrases)?,
            url_params: UrlParamSanitizer::default(),
            token_prefixes: TokenPrefixSanitizer::with_defaults(
                token_prefixes,
                default_token_prefixes(mask_all_default_tokens),
            )?,
            after_phrases: Vec::new(),
            after_url_params: Vec::new(),
        })
    }

    /// Sanitize `input`, appending the bytes that are final to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        self.after_phrases.clear();
        self.after_url_params.clear();
        self.phrases.push(input, &mut self.after_phrases);
        self.url_params.push(&self.after_phrases, &mut self.after_url_params);
        self.token_prefixes.push(&self.after_url_params, out);
    }

    /// Mask `phrases` too from now on, as if they had been given to [`Masker::new`].
    pub fn learn<I, P>(&mut self, phrases: I) -> Result<(), MaskError>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<[u8]>,
    {
        self.phrases.learn(phrases)
    }

    /// What the chain carries into the next write.
    pub fn state(&self) -> MaskerState {
        MaskerState {
            phrase_pending: self.phrases.pending.clone(),
            url: self.url_params.state.clone(),
            token_pending: self.token_prefixes.pending.clone(),
            in_token: self.token_prefixes.in_token,
            token_dropped: self.token_prefixes.token_dropped,
        }
    }

    /// Carry on from `state` (taken from a masker built with the same phrases and prefixes).
    pub fn restore(&mut self, state: MaskerState) {
        self.phrases.pending = state.phrase_pending;
        self.url_params.state = state.url;
        self.token_prefixes.pending = state.token_pending;
        self.token_prefixes.in_token = state.in_token;
        self.token_prefixes.token_dropped = state.token_dropped;
    }

    /// End of stream: release every held-back byte through the rest of the chain.
    pub fn flush(&mut self, out: &mut Vec<u8>) {
        self.after_phrases.clear();
        self.after_url_params.clear();
        self.phrases.flush(&mut self.after_phrases);
        self.url_params.push(&self.after_phrases, &mut self.after_url_params);
        self.url_params.flush(&mut self.after_url_params);
        self.token_prefixes.push(&self.after_url_params, out);
        self.token_prefixes.flush(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masker(phrases: &[&str], prefixes: &[&str]) -> Masker {
        let prefixes: Vec<String> = prefixes.iter().map(|p| p.to_string()).collect();
        Masker::new(phrases, &prefixes).expect("patterns compile")
    }

    /// Feed `chunks` one `push` at a time, then flush.
    fn run(m: &mut Masker, chunks: &[&[u8]]) -> String {
        let mut out = Vec::new();
        for chunk in chunks {
            m.push(chunk, &mut out);
        }
        m.flush(&mut out);
        String::from_utf8(out).expect("utf-8")
    }

    /// Every split of `input` into 1..=3 chunks must give the same result as one push.
    fn assert_split_invariant(phrases: &[&str], prefixes: &[&str], input: &str, expected: &str) {
        let bytes = input.as_bytes();
        assert_eq!(run(&mut masker(phrases, prefixes), &[bytes]), expected, "whole input");
        for i in 0..=bytes.len() {
            for j in i..=bytes.len() {
                let got = run(&mut masker(phrases, prefixes), &[&bytes[..i], &bytes[i..j], &bytes[j..]]);
                assert_eq!(got, expected, "split at {i},{j}");
            }
        }
    }

    #[test]
    fn a_restored_masker_goes_on_as_the_original_would_have() {
        let input = "a ?private_token=abcdef&x=1 SECRET-VALUE glpat-123456 end";
        for split in 0..=input.len() {
            let mut whole = masker(&["SECRET-VALUE"], &[]);
            let expected = run(&mut whole, &[input.as_bytes()]);
            let mut first = masker(&["SECRET-VALUE"], &[]);
            let mut out = Vec::new();
            first.push(&input.as_bytes()[..split], &mut out);
            let mut second = masker(&["SECRET-VALUE"], &[]);
            second.restore(first.state());
            second.push(&input.as_bytes()[split..], &mut out);
            second.flush(&mut out);
            assert_eq!(String::from_utf8_lossy(&out), expected, "split at {split}");
        }
    }

    #[test]
    fn phrase_is_masked_across_any_split() {
        assert_split_invariant(&["s3cr3t"], &[], "a s3cr3t b s3cr3 s3cr3t", "a [MASKED] b s3cr3 [MASKED]");
    }

    #[test]
    fn longest_phrase_wins_and_overlaps_resolve_leftmost() {
        assert_split_invariant(
            &["abc", "abcdef", "cde"],
            &[],
            "xabcdefx abcx abcdx",
            "x[MASKED]x [MASKED]x [MASKED]dx",
        );
    }

    #[test]
    fn partial_phrase_at_end_is_released_unmasked_on_flush() {
        let mut m = masker(&["password"], &[]);
        let mut out = Vec::new();
        m.push(b"the pass", &mut out);
        assert_eq!(out, b"the ", "the possible start of the phrase is held back");
        m.flush(&mut out);
        assert_eq!(out, b"the pass");
    }

    #[test]
    fn duplicate_and_empty_phrases_are_ignored() {
        assert_split_invariant(&["tok", "", "tok"], &[], "tok tok", "[MASKED] [MASKED]");
    }

    #[test]
    fn glpat_keeps_its_prefix() {
        assert_split_invariant(&[], &[], "token glpat-AbC_123.x=y-z end", "token glpat-[MASKED] end");
    }

    #[test]
    fn bare_prefix_is_left_alone() {
        assert_split_invariant(&[], &[], "glpat- and glrt-", "glpat- and glrt-");
    }

    #[test]
    fn longer_default_prefix_wins_over_shorter() {
        assert_split_invariant(&[], &[], "glrtr-abc glrt-def", "glrtr-[MASKED] glrt-[MASKED]");
    }

    #[test]
    fn without_mask_all_default_tokens_only_personal_tokens_are_masked() {
        let mut m = Masker::for_job(Vec::<Vec<u8>>::new(), &["MYCO_".to_string()], false).expect("compiles");
        let out = run(&mut m, &[b"glpat-abc glrt-def MYCO_ghi"]);
        assert_eq!(out, "glpat-[MASKED] glrt-def MYCO_[MASKED]");
    }

    #[test]
    fn job_prefixes_are_added_and_capped_at_fifteen() {
        let job: Vec<String> = (0..20).map(|i| format!("custom{i}_")).collect();
        let mut m = Masker::new(Vec::<Vec<u8>>::new(), &job).expect("compiles");
        let out = run(&mut m, &[b"custom0_abc custom14_abc custom15_abc glpat-abc"]);
        assert_eq!(out, "custom0_[MASKED] custom14_[MASKED] custom15_abc glpat-abc");
        assert_split_invariant(&[], &["MYCO_"], "x MYCO_abcd y", "x MYCO_[MASKED] y");
    }

    #[test]
    fn session_cookie_prefix() {
        assert_split_invariant(&[], &[], "Cookie: _gitlab_session=abcd1234; x", "Cookie: _gitlab_session=[MASKED]; x");
    }

    #[test]
    fn url_params_are_masked_case_insensitively() {
        assert_split_invariant(
            &[],
            &[],
            "GET https://h/p?private_token=abc&X-Amz-Signature=f00&ok=1 done",
            "GET https://h/p?private_token=[MASKED]&X-Amz-Signature=[MASKED]&ok=1 done",
        );
        assert_split_invariant(
            &[],
            &[],
            "u?a=1&x-amz-credential=AK/2024/us/s3/aws4_request\nnext ?rss_token=zz",
            "u?a=1&x-amz-credential=[MASKED]\nnext ?rss_token=[MASKED]",
        );
    }

    #[test]
    fn url_param_without_separator_is_not_masked() {
        assert_split_invariant(
            &[],
            &[],
            "private_token=abc ?authenticity_tokenx=1",
            "private_token=abc ?authenticity_tokenx=1",
        );
    }

    #[test]
    fn chain_runs_phrases_then_urls_then_prefixes() {
        assert_split_invariant(
            &["hunter2"],
            &[],
            "pw=hunter2 url=?private_token=glpat-xyz tok=glpat-xyz",
            "pw=[MASKED] url=?private_token=[MASKED] tok=glpat-[MASKED]",
        );
    }

    #[test]
    fn phrases_learnt_later_are_masked_from_then_on() {
        let mut m = masker(&["first"], &[]);
        let mut out = Vec::new();
        m.push(b"first late-secret se", &mut out);
        m.learn(["late-secret", "second"]).expect("compiles");
        m.push(b"cond late-secret\n", &mut out);
        m.flush(&mut out);
        // Bytes released before learning stay as they were (`se` was no start of a phrase then).
        assert_eq!(String::from_utf8(out).unwrap(), "[MASKED] late-secret second [MASKED]\n");
    }

    #[test]
    fn masks_variables_marked_masked_in_the_payload() {
        let job = crate::payload::JobResponse::from_json(
            br#"{"id":1,"token":"t","variables":[
                {"key":"A","value":"visible","masked":false},
                {"key":"B","value":"hidden-value","masked":true}],
                "features":{"token_mask_prefixes":["abc_"]}}"#,
        )
        .expect("payload decodes");
        let mut m = Masker::new(job.masked_values(), &job.features.token_mask_prefixes).expect("compiles");
        assert_eq!(run(&mut m, &[b"visible hidden-value abc_123"]), "visible [MASKED] abc_[MASKED]");
    }
}
