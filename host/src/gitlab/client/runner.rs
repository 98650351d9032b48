//! The runner-token management calls (protocol §1.1–§1.5): legacy registration, verify,
//! unregistering a runner or one of its managers, and resetting the runner token.

use reqwest::header::ACCEPT;
use reqwest::{Method, Response, StatusCode};
use serde_json::{json, Value};

use super::http::error_message;
use super::{api_base_url, describe_reqwest_error, ApiError, Endpoint, GitLabClient};
use super::{RegisterParams, ResetTokenResponse, RunnerCredentials, RunnerDetails, VersionInfo};

impl GitLabClient {
    /// `POST /runners` with a legacy registration token (§1.1).
    pub async fn register_legacy(
        &self,
        url: &str,
        registration_token: &str,
        params: &RegisterParams,
        info: &VersionInfo,
    ) -> Result<RunnerDetails, ApiError> {
        let endpoint = Endpoint::RegisterRunner;
        let base = api_base_url(url)?;
        let mut body = json!({
            "token": registration_token,
            "description": params.description,
            "run_untagged": params.run_untagged,
            "locked": params.locked,
            "paused": params.paused,
            "info": info,
        });
        if !params.maintenance_note.is_empty() {
            body["maintenance_note"] = params.maintenance_note.clone().into();
        }
        if !params.tags.is_empty() {
            body["tag_list"] = params.tags.join(",").into();
        }
        if !params.access_level.is_empty() {
            body["access_level"] = params.access_level.clone().into();
        }
        if params.maximum_timeout > 0 {
            body["maximum_timeout"] = params.maximum_timeout.into();
        }
        let response = self
            .execute(
                endpoint,
                Method::POST,
                &Self::endpoint_url(&base, "runners")?,
                Self::runner_token_request(registration_token, &body),
            )
            .await
            .map_err(|e| e.at(endpoint))?;
        match response.status() {
            StatusCode::CREATED => decode_details(endpoint, response, None).await,
            StatusCode::FORBIDDEN => Err(ApiError::Forbidden { endpoint, message: error_message(response).await }),
            StatusCode::GONE => Err(ApiError::RegistrationDisabled),
            status => {
                Err(ApiError::Status { endpoint, status: status.as_u16(), message: error_message(response).await })
            }
        }
    }

    /// `POST /runners/verify` (§1.3). Older GitLab answers a plain `200` text; then the
    /// details are the token itself with id 0.
    pub async fn verify(&self, creds: &RunnerCredentials, info: &VersionInfo) -> Result<RunnerDetails, ApiError> {
        let endpoint = Endpoint::VerifyRunner;
        let base = api_base_url(&creds.url)?;
        let mut body = json!({ "token": creds.token, "info": info });
        if !creds.system_id.is_empty() {
            body["system_id"] = creds.system_id.clone().into();
        }
        let response = self
            .execute(
                endpoint,
                Method::POST,
                &Self::endpoint_url(&base, "runners/verify")?,
                Self::runner_token_request(&creds.token, &body),
            )
            .await
            .map_err(|e| e.at(endpoint))?;
        self.remember_last_update(&base, &creds.token, response.headers());
        match response.status() {
            StatusCode::OK => decode_details(endpoint, response, Some(&creds.token)).await,
            StatusCode::FORBIDDEN => Err(ApiError::Forbidden { endpoint, message: error_message(response).await }),
            status => {
                Err(ApiError::Status { endpoint, status: status.as_u16(), message: error_message(response).await })
            }
        }
    }

    /// `POST /runners/reset_authentication_token` (§1.5): a new token for this runner; GitLab
    /// revokes the old one. 403 when the token is invalid, expired or revoked already.
    pub async fn reset_token(&self, creds: &RunnerCredentials) -> Result<ResetTokenResponse, ApiError> {
        let endpoint = Endpoint::ResetToken;
        let base = api_base_url(&creds.url)?;
        let body = json!({ "token": creds.token });
        let response = self
            .execute(
                endpoint,
                Method::POST,
                &Self::endpoint_url(&base, "runners/reset_authentication_token")?,
                Self::runner_token_request(&creds.token, &body),
            )
            .await
            .map_err(|e| e.at(endpoint))?;
        reset_token_response(endpoint, response, &[StatusCode::FORBIDDEN]).await
    }

    /// `POST /runners/:id/reset_authentication_token` with a personal access token in
    /// `PRIVATE-TOKEN` (gitlab-runner's `reset-token --pat`): a new token for runner `id` when
    /// its own token is lost or expired. 403/401 when the access token may not.
    pub async fn reset_token_with_pat(&self, url: &str, id: i64, pat: &str) -> Result<ResetTokenResponse, ApiError> {
        let endpoint = Endpoint::ResetToken;
        let base = api_base_url(url)?;
        let url = Self::endpoint_url(&base, &format!("runners/{id}/reset_authentication_token"))?;
        let response = self
            .execute(endpoint, Method::POST, &url, |rb| {
                rb.header(ACCEPT, "application/json").header("PRIVATE-TOKEN", pat)
            })
            .await
            .map_err(|e| e.at(endpoint))?;
        reset_token_response(endpoint, response, &[StatusCode::FORBIDDEN, StatusCode::UNAUTHORIZED]).await
    }

    /// `DELETE /runners` (§1.4): removes the whole runner (legacy-registered runners).
    pub async fn unregister_runner(&self, creds: &RunnerCredentials) -> Result<(), ApiError> {
        let body = json!({ "token": creds.token });
        self.delete(Endpoint::UnregisterRunner, creds, "runners", &body).await
    }

    /// `DELETE /runners/managers` (§1.4): removes only this runner manager (`glrt-` runners).
    pub async fn unregister_manager(&self, creds: &RunnerCredentials) -> Result<(), ApiError> {
        let body = json!({ "token": creds.token, "system_id": creds.system_id });
        self.delete(Endpoint::UnregisterRunnerManager, creds, "runners/managers", &body).await
    }

    async fn delete(
        &self,
        endpoint: Endpoint,
        creds: &RunnerCredentials,
        path: &str,
        body: &Value,
    ) -> Result<(), ApiError> {
        let base = api_base_url(&creds.url)?;
        let response = self
            .execute(
                endpoint,
                Method::DELETE,
                &Self::endpoint_url(&base, path)?,
                Self::runner_token_request(&creds.token, body),
            )
            .await
            .map_err(|e| e.at(endpoint))?;
        match response.status() {
            StatusCode::NO_CONTENT => Ok(()),
            StatusCode::FORBIDDEN => Err(ApiError::Forbidden { endpoint, message: error_message(response).await }),
            status => {
                Err(ApiError::Status { endpoint, status: status.as_u16(), message: error_message(response).await })
            }
        }
    }
}

async fn decode_details(
    endpoint: Endpoint,
    response: Response,
    plain_token: Option<&str>,
) -> Result<RunnerDetails, ApiError> {
    let bytes =
        response.bytes().await.map_err(|e| ApiError::Transport { endpoint, message: describe_reqwest_error(&e) })?;
    match serde_json::from_slice::<RunnerDetails>(&bytes) {
        Ok(details) => Ok(details),
        Err(_) if plain_token.is_some() && !bytes.trim_ascii().starts_with(b"{") => {
            Ok(RunnerDetails { id: 0, token: plain_token.unwrap_or_default().to_string(), token_expires_at: None })
        }
        Err(e) => Err(ApiError::InvalidResponse { endpoint, message: e.to_string() }),
    }
}

/// A reset's answer: 201 with the new token, `refused` statuses as [`ApiError::Forbidden`],
/// anything else as its status.
async fn reset_token_response(
    endpoint: Endpoint,
    response: Response,
    refused: &[StatusCode],
) -> Result<ResetTokenResponse, ApiError> {
    match response.status() {
        StatusCode::CREATED => {
            let bytes = response
                .bytes()
                .await
                .map_err(|e| ApiError::Transport { endpoint, message: describe_reqwest_error(&e) })?;
            let reset: ResetTokenResponse = serde_json::from_slice(&bytes)
                .map_err(|e| ApiError::InvalidResponse { endpoint, message: e.to_string() })?;
            if reset.token.is_empty() {
                return Err(ApiError::InvalidResponse { endpoint, message: "no token in the response".into() });
            }
            Ok(reset)
        }
        status if refused.contains(&status) => {
            Err(ApiError::Forbidden { endpoint, message: error_message(response).await })
        }
        status => Err(ApiError::Status { endpoint, status: status.as_u16(), message: error_message(response).await }),
    }
}
