//! The published draw's page: the commitments, the seed once revealed, the
//! entries in the published order and every admission.

use askama::Template;

use super::sale::SaleView;
use super::Nav;
use crate::domain::draw::{DrawRecord, PassState};
use crate::web::format::{iso, timestamp};

/// One entry of the draw page.
pub struct DrawEntryRow {
    pub ticket: String,
    pub seq: u64,
    /// To the millisecond, in UTC: what the `late` flag is checked against.
    pub joined_at_text: String,
    pub late: bool,
    /// 1-based place in the published order; None before the draw.
    pub position: Option<usize>,
}

pub struct DrawAdmissionRow {
    pub number: usize,
    pub ticket: String,
    pub issued_at_text: String,
    pub state: &'static str,
}

#[derive(Template)]
#[template(path = "draw.html")]
pub struct DrawPage {
    pub nav: Nav,
    pub sale: SaleView,
    pub commitment: String,
    /// The frozen pre-queue's SHA-256, published at the start before the seed.
    pub entries_commitment: Option<String>,
    pub seed: Option<String>,
    pub starts_at_iso: String,
    pub starts_at_text: String,
    /// In the published order once drawn, else in join order.
    pub entries: Vec<DrawEntryRow>,
    pub admissions: Vec<DrawAdmissionRow>,
    pub late: usize,
    /// The signed-in customer's own ticket, marked in the tables.
    pub my_ticket: Option<String>,
}

impl DrawPage {
    /// Whether `ticket` is the reader's own.
    pub fn is_mine(&self, ticket: &str) -> bool {
        self.my_ticket.as_deref() == Some(ticket)
    }

    pub fn new(nav: Nav, sale: SaleView, record: &DrawRecord) -> DrawPage {
        let position: std::collections::HashMap<&str, usize> = record
            .order
            .iter()
            .enumerate()
            .map(|(i, ticket)| (ticket.as_str(), i + 1))
            .collect();
        let mut entries: Vec<DrawEntryRow> = record
            .entries
            .iter()
            .map(|entry| DrawEntryRow {
                ticket: entry.ticket.as_str().to_string(),
                seq: entry.seq,
                joined_at_text: entry
                    .joined_at
                    .format("%Y-%m-%d %H:%M:%S%.3f UTC")
                    .to_string(),
                late: entry.late,
                position: position.get(entry.ticket.as_str()).copied(),
            })
            .collect();
        entries.sort_by_key(|row| (row.position.unwrap_or(usize::MAX), row.seq));
        let admissions = record
            .admissions
            .iter()
            .enumerate()
            .map(|(i, admission)| DrawAdmissionRow {
                number: i + 1,
                ticket: admission.ticket.as_str().to_string(),
                issued_at_text: admission
                    .issued_at
                    .format("%Y-%m-%d %H:%M:%S%.3f UTC")
                    .to_string(),
                state: match admission.state {
                    PassState::Issued => "pass open",
                    PassState::Used => "bought",
                    PassState::Lapsed => "lapsed (place passed on)",
                },
            })
            .collect();
        DrawPage {
            nav,
            sale,
            commitment: record.seed_sha256.to_string(),
            entries_commitment: record.entries_sha256.as_ref().map(ToString::to_string),
            seed: record.seed.as_ref().map(|s| s.to_hex()),
            starts_at_iso: iso(&record.starts_at),
            starts_at_text: timestamp(record.starts_at),
            late: record.entries.iter().filter(|e| e.late).count(),
            entries,
            admissions,
            my_ticket: None,
        }
    }

    pub fn drawn(&self) -> bool {
        self.seed.is_some()
    }
}
