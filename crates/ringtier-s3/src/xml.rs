//! The S3 XML answers this crate reads itself (the calls object_store has none for:
//! ListMultipartUploads, CreateMultipartUpload and CompleteMultipartUpload with checksums,
//! error bodies), parsed from bytes a server sent, so from untrusted input.
//!
//! Every function here is bounded before it allocates: a body longer than the caller's cap
//! is refused before it is read into memory (see [`read_capped`]); a leaf element is at most
//! [`MAX_ELEMENT_BYTES`] long (escaped), an unescaped key at most [`MAX_KEY_BYTES`], a page
//! at most [`MAX_UPLOADS_PER_PAGE`] uploads. None of them panics on any input (the fuzz
//! target `s3_xml` calls them through [`crate::fuzzing`]).

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

/// Longest object key S3 accepts, in bytes.
pub(crate) const MAX_KEY_BYTES: usize = 1024;
/// Longest element text read (escaped): an escaped key (`&amp;` is 5 bytes for 1), an upload
/// id, an error message.
pub(crate) const MAX_ELEMENT_BYTES: usize = 6 * MAX_KEY_BYTES;
/// Most `<Upload>` elements one ListMultipartUploads page may hold (S3 sends at most 1000).
pub(crate) const MAX_UPLOADS_PER_PAGE: usize = 10_000;
/// Longest upload id kept (AWS's are about 100 bytes).
pub(crate) const MAX_UPLOAD_ID_BYTES: usize = 1024;
/// Longest text of an error answer quoted in an error message.
pub(crate) const MAX_QUOTED_BYTES: usize = 512;

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XmlError(pub String);

impl std::fmt::Display for XmlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why [`read_capped`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// The body is longer than the cap (announced or streamed): the server's answer is not
    /// one to keep (permanent).
    TooLong(String),
    /// The body could not be read (a transport error: temporary).
    Body(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::TooLong(m) | ReadError::Body(m) => f.write_str(m),
        }
    }
}

/// Reads a body stream into memory, refusing it once it passes `cap` bytes (before the
/// chunk that would pass it is kept). `announced`: the Content-Length, checked first.
pub(crate) async fn read_capped<S, E>(mut body: S, announced: Option<u64>, cap: usize) -> Result<Bytes, ReadError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    if let Some(n) = announced {
        if n > cap as u64 {
            return Err(ReadError::TooLong(format!(
                "the answer's body announces {n} bytes, more than the {cap} bytes allowed"
            )));
        }
    }
    let mut out = BytesMut::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| ReadError::Body(format!("body: {e}")))?;
        if out.len() + chunk.len() > cap {
            return Err(ReadError::TooLong(format!("the answer's body is longer than the {cap} bytes allowed")));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

/// The texts of the `<tag>...</tag>` elements of `xml` (slices of it: nothing copied), in
/// order, at most `max` of them (more is an error). An element opened and never closed ends
/// the scan.
pub(crate) fn elements<'a>(xml: &'a str, tag: &str, max: usize) -> Result<Vec<&'a str>, XmlError> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        if out.len() == max {
            return Err(XmlError(format!("more than {max} <{tag}> elements")));
        }
        out.push(&after[..j]);
        rest = &after[j + close.len()..];
    }
    Ok(out)
}

/// The text of the first `<tag>` element, bounded as [`elements`] bounds each one.
pub(crate) fn first<'a>(xml: &'a str, tag: &str) -> Result<Option<&'a str>, XmlError> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let Some(i) = xml.find(&open) else { return Ok(None) };
    let after = &xml[i + open.len()..];
    let Some(j) = after.find(&close) else { return Ok(None) };
    let text = &after[..j];
    if text.len() > MAX_ELEMENT_BYTES {
        return Err(XmlError(format!("<{tag}> is {} bytes long, more than {MAX_ELEMENT_BYTES}", text.len())));
    }
    Ok(Some(text))
}

/// `s` with the five XML entities decoded; refused when longer than `max` bytes (checked on
/// the escaped text, which is never shorter, before anything is allocated).
pub(crate) fn unescape(s: &str, max: usize) -> Result<String, XmlError> {
    if s.len() > max.saturating_mul(6) {
        return Err(XmlError(format!("a value of {} bytes, more than {max} allowed", s.len())));
    }
    let out = s
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&");
    if out.len() > max {
        return Err(XmlError(format!("a value of {} bytes, more than {max} allowed", out.len())));
    }
    Ok(out)
}

/// Largest upload marker read (`PATH\nUPLOAD_ID\n`).
pub(crate) const MAX_MARKER_BYTES: usize = MAX_KEY_BYTES + MAX_UPLOAD_ID_BYTES + 2;

/// The object path and upload id of an upload marker (`PATH\nUPLOAD_ID\n`, written by this
/// crate); `None` when it is not one.
pub(crate) fn parse_marker(body: &[u8]) -> Option<(String, String)> {
    if body.len() > MAX_MARKER_BYTES {
        return None;
    }
    let text = std::str::from_utf8(body).ok()?;
    let mut lines = text.lines();
    let (path, id) = (lines.next()?, lines.next()?);
    let ok = !path.is_empty() && path.len() <= MAX_KEY_BYTES && !id.is_empty() && id.len() <= MAX_UPLOAD_ID_BYTES;
    ok.then(|| (path.to_string(), id.to_string()))
}

/// One page of a ListMultipartUploads answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UploadsPage {
    /// (object key in the bucket, upload id) of each upload listed.
    pub uploads: Vec<(String, String)>,
    /// Whether more pages follow.
    pub truncated: bool,
    /// Where the next page starts: `NextKeyMarker`, `NextUploadIdMarker`.
    pub next: (String, String),
}

/// Parses a ListMultipartUploads answer, bounded (at most [`MAX_UPLOADS_PER_PAGE`] uploads,
/// keys of at most [`MAX_KEY_BYTES`], ids of at most [`MAX_UPLOAD_ID_BYTES`]). An upload
/// without a key or an id is skipped.
pub(crate) fn parse_uploads_page(body: &[u8]) -> Result<UploadsPage, XmlError> {
    let text = std::str::from_utf8(body).map_err(|e| XmlError(format!("not UTF-8: {e}")))?;
    let mut page = UploadsPage::default();
    let uploads = elements(text, "Upload", MAX_UPLOADS_PER_PAGE)?;
    page.uploads.reserve(uploads.len());
    for upload in uploads {
        let (Some(k), Some(id)) = (first(upload, "Key")?, first(upload, "UploadId")?) else {
            continue;
        };
        page.uploads.push((unescape(k, MAX_KEY_BYTES)?, unescape(id, MAX_UPLOAD_ID_BYTES)?));
    }
    // The markers are read after the uploads: cut out of the text before them, so a marker
    // element inside an upload is not taken for the page's.
    let tail = text.rfind("</Upload>").map_or(text, |i| &text[i..]);
    page.truncated = first(tail, "IsTruncated")?.is_some_and(|t| t.trim() == "true");
    page.next = (
        first(tail, "NextKeyMarker")?.map(|s| unescape(s, MAX_KEY_BYTES)).transpose()?.unwrap_or_default(),
        first(tail, "NextUploadIdMarker")?.map(|s| unescape(s, MAX_UPLOAD_ID_BYTES)).transpose()?.unwrap_or_default(),
    );
    Ok(page)
}

/// The upload id of a CreateMultipartUpload answer.
pub(crate) fn parse_upload_id(body: &[u8]) -> Result<Option<String>, XmlError> {
    let text = String::from_utf8_lossy(body);
    first(&text, "UploadId")?.map(|id| unescape(id, MAX_UPLOAD_ID_BYTES)).transpose()
}

/// The object checksum (`ChecksumCRC32C`) of a CompleteMultipartUpload answer, and whether
/// the answer is an error (`<Error>`: S3 may answer 200 and fail).
pub(crate) fn parse_complete(body: &[u8]) -> Result<(bool, Option<String>), XmlError> {
    let text = String::from_utf8_lossy(body);
    let is_error = text.contains("<Error>");
    let sum = first(&text, "ChecksumCRC32C")?.map(|s| unescape(s, 256)).transpose()?;
    Ok((is_error, sum))
}

/// The `Code` and `Message` of an S3 error answer, each cut to [`MAX_QUOTED_BYTES`]; empty
/// when missing or unreadable.
pub(crate) fn parse_error(body: &[u8]) -> (String, String) {
    let text = String::from_utf8_lossy(&body[..body.len().min(64 << 10)]);
    let get = |tag| first(&text, tag).ok().flatten().map(quote).unwrap_or_default();
    (get("Code"), get("Message"))
}

/// At most [`MAX_QUOTED_BYTES`] of `s` (cut at a character boundary), for error messages.
pub(crate) fn quote(s: &str) -> String {
    if s.len() <= MAX_QUOTED_BYTES {
        return s.to_string();
    }
    let mut end = MAX_QUOTED_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upload_listing() {
        let xml = b"<ListMultipartUploadsResult><Upload><Key>p/a&amp;b</Key><UploadId>X1</UploadId></Upload>\
                   <Upload><Key>p/c</Key><UploadId>Y2</UploadId></Upload><IsTruncated>true</IsTruncated>\
                   <NextKeyMarker>p/c</NextKeyMarker><NextUploadIdMarker>Y2</NextUploadIdMarker></ListMultipartUploadsResult>";
        let page = parse_uploads_page(xml).expect("page");
        assert_eq!(page.uploads, [("p/a&b".to_string(), "X1".to_string()), ("p/c".to_string(), "Y2".to_string())]);
        assert!(page.truncated);
        assert_eq!(page.next, ("p/c".to_string(), "Y2".to_string()));
    }

    #[test]
    fn hostile_answers_are_refused_not_allocated() {
        let many = "<Upload><Key>k</Key><UploadId>i</UploadId></Upload>".repeat(MAX_UPLOADS_PER_PAGE + 1);
        assert!(parse_uploads_page(many.as_bytes()).is_err(), "too many uploads on one page");
        let long_key = format!("<Upload><Key>{}</Key><UploadId>i</UploadId></Upload>", "k".repeat(MAX_KEY_BYTES + 1));
        assert!(parse_uploads_page(long_key.as_bytes()).is_err(), "a key past S3's limit");
        let long_id = format!("<UploadId>{}</UploadId>", "i".repeat(MAX_ELEMENT_BYTES + 1));
        assert!(parse_upload_id(long_id.as_bytes()).is_err());
        assert_eq!(parse_uploads_page(b"<Upload><Key>k").expect("unclosed").uploads, []);
        assert_eq!(parse_uploads_page(b"\xff\xfe").map_err(|e| e.0.contains("UTF-8")), Err(true));
        let (code, msg) =
            parse_error(format!("<Error><Code>X</Code><Message>{}</Message>", "m".repeat(5000)).as_bytes());
        assert_eq!(code, "X");
        assert!(msg.len() < 600, "{}", msg.len());
        assert_eq!(quote("ééé"), "ééé");
        assert!(quote(&"é".repeat(600)).ends_with("(1200 bytes)"));
    }

    #[tokio::test]
    async fn a_body_past_its_cap_is_refused() {
        let chunks = || futures::stream::iter((0..4).map(|_| Ok::<_, String>(Bytes::from_static(&[1u8; 100]))));
        assert_eq!(read_capped(chunks(), None, 400).await.expect("fits").len(), 400);
        assert!(read_capped(chunks(), None, 399).await.is_err());
        assert!(read_capped(chunks(), Some(1 << 40), 400).await.is_err(), "a huge Content-Length refused at once");
    }
}
