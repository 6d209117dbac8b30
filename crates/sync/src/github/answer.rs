//! What GitHub answered to a request that failed: its status and message,
//! kept as the cause of the error made of it, so callers match the status
//! and never the wording; and the detail of a validation error.

use base::error::Error;

/// GitHub's answer to a request that failed: its HTTP status and
/// `message`, the cause of every error the client makes of an answer, so
/// callers match the status ([`status_of`]), never the wording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub message: String,
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {} {}", self.status, self.message)
    }
}

impl std::error::Error for Answer {}

/// The HTTP status GitHub answered, when `e` is made of an answer.
pub fn status_of(e: &Error) -> Option<u16> {
    answer_of(e).map(|a| a.status)
}

/// The `message` GitHub answered, when `e` is made of an answer.
pub fn answer_of(e: &Error) -> Option<&Answer> {
    e.source.as_ref()?.downcast_ref::<Answer>()
}

pub(super) fn validation_detail(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return String::new();
    };
    let Some(errs) = v.get("errors").and_then(|e| e.as_array()) else {
        return String::new();
    };
    let parts: Vec<String> = errs
        .iter()
        .filter_map(|e| {
            let text = |k: &str| e.get(k).and_then(|m| m.as_str());
            // A custom error's message, else the field and its code
            // (`base invalid`): GitHub's two shapes of a validation error.
            text("message")
                .map(str::to_string)
                .or_else(|| Some(format!("{} {}", text("field")?, text("code")?)))
        })
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_validation_error_names_a_custom_message_or_the_field_and_its_code() {
        let body = br#"{"message":"Validation Failed","errors":[{"resource":"PullRequest","field":"base","code":"invalid"},{"resource":"PullRequest","code":"custom","message":"No commits between main and x"}]}"#;
        assert_eq!(
            super::validation_detail(body),
            ": base invalid; No commits between main and x"
        );
    }
}
