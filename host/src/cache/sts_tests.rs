//! Unit tests of the STS wire: endpoints, the session policy, the signed request (checked
//! against botocore's signature of the same request) and the reading of answers.

use chrono::TimeZone;

use super::*;

fn creds() -> AwsCredentials {
    AwsCredentials {
        access_key_id: "AKIDEXAMPLE".into(),
        secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
        session_token: None,
        expires: None,
    }
}

#[test]
fn endpoints_as_the_aws_sdks_derive_them() {
    assert_eq!(regional_endpoint("eu-west-1"), "https://sts.eu-west-1.amazonaws.com");
    assert_eq!(regional_endpoint("us-gov-west-1"), "https://sts.us-gov-west-1.amazonaws.com");
    assert_eq!(regional_endpoint("cn-north-1"), "https://sts.cn-north-1.amazonaws.com.cn");
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    };
    assert_eq!(endpoint_override(&env(&[])), None);
    assert_eq!(
        endpoint_override(&env(&[("AWS_ENDPOINT_URL", "http://127.0.0.1:5000/")])).as_deref(),
        Some("http://127.0.0.1:5000")
    );
    assert_eq!(
        endpoint_override(&env(&[
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:5000"),
            ("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:6000")
        ]))
        .as_deref(),
        Some("http://127.0.0.1:6000"),
        "the service's own variable wins"
    );
    assert_eq!(
        endpoint_override(&env(&[
            ("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:6000"),
            ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
        ])),
        None
    );
}

#[test]
fn session_policy_is_gitlab_runners() {
    assert_eq!(
        session_policy("eu-west-1", "bucket", "runner/tok/project/1/main", true, None),
        r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:PutObject"],"Resource":"arn:aws:s3:::bucket/runner/tok/project/1/main"}]}"#
    );
    assert_eq!(
        session_policy("us-gov-west-1", "b", "o", false, Some("arn:aws-us-gov:kms:us-gov-west-1:1:key/k")),
        r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:GetObject"],"Resource":"arn:aws-us-gov:s3:::b/o"},{"Effect":"Allow","Action":["kms:Decrypt","kms:GenerateDataKey"],"Resource":"arn:aws-us-gov:kms:us-gov-west-1:1:key/k"}]}"#
    );
    let quoted = session_policy("cn-north-1", "b", "a\"b", false, None);
    assert!(quoted.contains(r#""Resource":"arn:aws-cn:s3:::b/a\"b""#), "a quote in a key stays a value: {quoted}");
    let parsed: serde_json::Value = serde_json::from_str(&quoted).expect("JSON");
    assert_eq!(parsed["Statement"].as_array().map(Vec::len), Some(1));
}

#[test]
fn session_names_are_gitlab_runners_and_random() {
    let (a, b) = (session_name(), session_name());
    assert_ne!(a, b);
    let suffix = a.strip_prefix("gitlab-runner-cache-upload-").expect("prefix");
    assert_eq!(suffix.len(), 16);
    assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
}

/// botocore (`SigV4Auth(creds, "sts", "us-east-1")`) signed this request at
/// 2026-11-28T09:30:46Z: the body, headers and signature must be the same.
#[test]
fn assume_role_request_matches_botocore() {
    let input = AssumeRoleInput {
        role_arn: "arn:aws:iam::123456789012:role/cache".into(),
        session_name: "gitlab-runner-cache-upload-0011223344556677".into(),
        policy: session_policy("us-east-1", "runway-cache", "runner/tok/project/1/main", true, None),
        duration: SESSION_DURATION,
    };
    let now = Utc.with_ymd_and_hms(2026, 11, 28, 9, 30, 46).single().expect("time");
    let req = request("https://sts.us-east-1.amazonaws.com", "us-east-1", &input, &creds(), now).expect("request");
    assert_eq!(req.url, "https://sts.us-east-1.amazonaws.com/");
    assert_eq!(
        String::from_utf8(req.body.clone()).expect("utf-8"),
        "Action=AssumeRole&Version=2011-06-15&RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fcache&RoleSessionName=gitlab-runner-cache-upload-0011223344556677&Policy=%7B%22Version%22%3A%222012-10-17%22%2C%22Statement%22%3A%5B%7B%22Effect%22%3A%22Allow%22%2C%22Action%22%3A%5B%22s3%3APutObject%22%5D%2C%22Resource%22%3A%22arn%3Aaws%3As3%3A%3A%3Arunway-cache%2Frunner%2Ftok%2Fproject%2F1%2Fmain%22%7D%5D%7D&DurationSeconds=3600"
    );
    let header = |n: &str| req.headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    assert_eq!(header("x-amz-date"), Some("20261128T093046Z"));
    assert_eq!(
        header("authorization"),
        Some("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261128/us-east-1/sts/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature=37b3e2d6e7ce2f8c609baa51c3afeedef78cdf69f266d72b650e6becf99ccd0a")
    );
    assert_eq!(header("x-amz-security-token"), None);
    let with_token = AwsCredentials { session_token: Some("tok".into()), ..creds() };
    let req = request("http://127.0.0.1:5000/base", "eu-west-1", &input, &with_token, now).expect("request");
    assert_eq!(req.url, "http://127.0.0.1:5000/base/");
    assert_eq!(req.headers.iter().find(|(k, _)| k == "x-amz-security-token").map(|(_, v)| v.as_str()), Some("tok"));
    assert!(matches!(request("sts.example", "us-east-1", &input, &creds(), now), Err(StsError::Endpoint(_))));
}

#[test]
fn answers_are_read() {
    let ok = "<AssumeRoleResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><AssumeRoleResult>\
        <Credentials><AccessKeyId>ASIAEXAMPLE</AccessKeyId><SecretAccessKey>s&amp;cret</SecretAccessKey>\
        <SessionToken>FwoG/tok+en=</SessionToken><Expiration>2026-11-28T10:30:46Z</Expiration></Credentials>\
        </AssumeRoleResult></AssumeRoleResponse>";
    let creds = parse_answer("r", 200, ok).expect("credentials");
    assert_eq!(creds.access_key_id, "ASIAEXAMPLE");
    assert_eq!(creds.secret_access_key, "s&cret");
    assert_eq!(creds.session_token.as_deref(), Some("FwoG/tok+en="));
    assert_eq!(creds.expires, Utc.with_ymd_and_hms(2026, 11, 28, 10, 30, 46).single());
    let denied = "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code>\
        <Message>not authorized to perform sts:AssumeRole</Message></Error></ErrorResponse>";
    let err = parse_answer("arn:aws:iam::1:role/r", 403, denied).expect_err("refused");
    assert_eq!(
        err.to_string(),
        "AssumeRole arn:aws:iam::1:role/r: STS answered 403: AccessDenied: not authorized to perform sts:AssumeRole"
    );
    let err = parse_answer("r", 200, "<AssumeRoleResponse/>").expect_err("no credentials");
    assert_eq!(err, StsError::Malformed { role: "r".into(), missing: "AccessKeyId" });
}
