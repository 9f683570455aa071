//! The customer's mail (issue #41) through a real SMTP server (aiosmtpd on
//! loopback, `helpers/smtp.rs`): each event's message is written with the
//! event and delivered once; the confirmation link confirms one account per
//! person; a mail server that is down for a minute, then back, gets every
//! message once; a sender killed between the server's answer and its mark
//! sends again under the same Message-ID; and without a mail server the
//! messages wait where an admin can read them.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use flashsale::domain::{CustomerId, ProductId};
use flashsale::services::mail::{self, sender, ConfirmLink, LinkKey};
use flashsale::services::waiting_room;
use reqwest::StatusCode;

use crate::helpers::*;

/// An app whose mail job sends to `smtp` every 200 ms.
async fn app_sending_to(smtp: &SmtpServer) -> TestApp {
    let url = smtp.url();
    spawn_app_with(move |s| {
        s.smtp_url = Some(url);
        s.mail_interval = Duration::from_millis(200);
    })
    .await
}

fn customer_id(app: &TestApp, email: &str) -> i64 {
    app.db.count(&format!(
        "SELECT id AS n FROM customers WHERE email = '{email}'"
    ))
}

fn confirmed_accounts(app: &TestApp) -> i64 {
    app.db
        .count("SELECT count(*) AS n FROM customers WHERE email_confirmed_at IS NOT NULL")
}

fn is_confirmed(app: &TestApp, email: &str) -> bool {
    app.db.count(&format!(
        "SELECT count(*) AS n FROM customers WHERE email = '{email}' AND email_confirmed_at IS NOT NULL"
    )) == 1
}

fn unique_email(tag: &str) -> String {
    format!(
        "{tag}-{}@example.com",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// The confirmation link of `email`'s latest message, rendered as the mail
/// job and the admin page render it (no mail server needed).
pub async fn link_of(app: &TestApp, email: &str) -> String {
    let entries = mail::recent(&app.shop, 100).await.unwrap();
    let entry = entries
        .iter()
        .find(|e| e.to == email && e.kind == "confirm-address")
        .unwrap_or_else(|| panic!("no confirmation message for {email}"));
    let start = entry.rendered.body.find("/account/confirm?").unwrap();
    let rest = &entry.rendered.body[start..];
    rest[..rest.find(char::is_whitespace).unwrap()].to_string()
}

/// Messages to `to` whose subject is `subject`.
pub fn with_subject<'a>(
    received: &'a [ReceivedMail],
    to: &str,
    subject: &str,
) -> Vec<&'a ReceivedMail> {
    received
        .iter()
        .filter(|m| m.header("to").contains(to) && m.subject() == subject)
        .collect()
}

/// Waits until the outbox has nothing left to send, at most `timeout`.
async fn wait_until_all_sent(app: &TestApp, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while app
        .db
        .count("SELECT count(*) AS n FROM mail_outbox WHERE sent_at IS NULL")
        > 0
    {
        assert!(
            Instant::now() < deadline,
            "messages still unsent after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sign_up_sends_one_confirmation_whose_link_confirms() {
    let smtp = SmtpServer::start();
    let app = app_sending_to(&smtp).await;
    let email = unique_email("ada");
    let customer = app.unconfirmed_customer(&email).await;
    let welcome = customer.get_text("/welcome").await.1;
    assert!(
        welcome.contains("Please confirm your email address"),
        "{welcome}"
    );

    wait_until_all_sent(&app, Duration::from_secs(20)).await;
    // Another few runs of the job: nothing more arrives.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let received = smtp.received();
    assert_eq!(received.len(), 1, "{received:#?}");
    let message = &received[0];
    assert_eq!(message.subject(), "Confirm your email address");
    assert!(message.header("to").contains(&email));
    let id = customer_id(&app, &email);
    assert!(
        message
            .message_id()
            .starts_with(&format!("<confirm-address.{id}.")),
        "{}",
        message.message_id()
    );
    assert!(message.message_id().ends_with("@flashsale.test>"));
    assert!(!is_confirmed(&app, &email));
    // With mail going out, the admin's copy does not carry the link.
    let (_, outbox) = app.admin().await.get_text("/admin/mail").await;
    assert!(outbox.contains("Confirm your email address"), "{outbox}");
    assert!(!outbox.contains("/account/confirm?"), "{outbox}");
    assert!(outbox.contains("sent to the customer only"), "{outbox}");

    // Opened in another browser, as from a phone's mail app.
    let link = message.link_path("/account/confirm?").expect("a link");
    let stranger = app.browser();
    let (status, page) = stranger.get_text(&link).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains(&format!("{email} is confirmed")), "{page}");
    assert!(is_confirmed(&app, &email));
    // Opening it again changes nothing and says so.
    let (status, page) = stranger.get_text(&link).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("was already confirmed"), "{page}");
    // The notice is gone from the account's pages.
    let orders = customer.get_text("/orders").await.1;
    assert!(
        !orders.contains("Please confirm your email address"),
        "{orders}"
    );
    assert_eq!(smtp.received().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tagged_or_dotted_gmail_duplicate_cannot_be_confirmed() {
    let app = spawn_app().await;
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let first = format!("ada.love{tag}@gmail.com");
    let tagged = format!("adalove{tag}+drops@googlemail.com");
    let dotted = format!("a.d.a.l.o.v.e{tag}@gmail.com");
    let elsewhere = format!("ada.love{tag}+drops@example.com");
    for email in [&first, &tagged, &dotted, &elsewhere] {
        app.unconfirmed_customer(email).await;
    }
    let stranger = app.browser();
    let (status, page) = stranger.get_text(&link_of(&app, &first).await).await;
    assert_eq!(status, StatusCode::OK, "{page}");

    for duplicate in [&tagged, &dotted] {
        let (status, page) = stranger.get_text(&link_of(&app, duplicate).await).await;
        assert_eq!(status, StatusCode::CONFLICT, "{page}");
        assert!(
            page.contains("This address already belongs to another account"),
            "{page}"
        );
        assert!(!is_confirmed(&app, duplicate));
    }
    assert_eq!(confirmed_accounts(&app), 1);
    // Dots count at other providers; the tag does not: another person there.
    let (status, _) = stranger.get_text(&link_of(&app, &elsewhere).await).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(confirmed_accounts(&app), 2);

    // An address changed (here by hand) must be confirmed again.
    let changed = format!("someone{tag}@example.com");
    diesel::RunQueryDsl::execute(
        diesel::sql_query(format!(
            "UPDATE customers SET email = '{changed}' WHERE email = '{first}'"
        )),
        &mut app.db.conn(),
    )
    .unwrap();
    assert!(!is_confirmed(&app, &changed));
    assert_eq!(confirmed_accounts(&app), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tampered_or_expired_link_confirms_nothing() {
    let app = spawn_app().await;
    let email = unique_email("eve");
    let customer = app.unconfirmed_customer(&email).await;
    let other = unique_email("mallory");
    app.unconfirmed_customer(&other).await;
    let link = link_of(&app, &email).await;
    let id = customer_id(&app, &email);

    // One hex digit of the code changed.
    let flipped = {
        let mut chars: Vec<char> = link.chars().collect();
        let last = chars.len() - 1;
        chars[last] = if chars[last] == '0' { '1' } else { '0' };
        chars.into_iter().collect::<String>()
    };
    // The right code moved to another account.
    let moved = link.replace(
        &format!("account={id}&"),
        &format!("account={}&", customer_id(&app, &other)),
    );
    let key = LinkKey::derive(&app.settings.session_key);
    let issued = (chrono::Utc::now() - chrono::Duration::hours(49)).timestamp();
    let expired = ConfirmLink::issue(&key, CustomerId(id), &email, issued).path();
    let missing_code = format!("/account/confirm?account={id}&issued={issued}");
    let not_numbers = "/account/confirm?account=x&issued=y&code=z".to_string();

    for (bad, status, words) in [
        (&flipped, StatusCode::BAD_REQUEST, "This link does not work"),
        (&moved, StatusCode::BAD_REQUEST, "This link does not work"),
        (
            &missing_code,
            StatusCode::BAD_REQUEST,
            "This link does not work",
        ),
        (
            &not_numbers,
            StatusCode::BAD_REQUEST,
            "This link does not work",
        ),
        (&expired, StatusCode::GONE, "This link has expired"),
    ] {
        // Signed in, the page offers a new link at once.
        let (got, page) = customer.get_text(bad).await;
        assert_eq!(got, status, "{bad}: {page}");
        assert!(page.contains(words), "{bad}: {page}");
        assert!(page.contains("Send a new link"), "{page}");
        assert_eq!(confirmed_accounts(&app), 0, "{bad} confirmed an account");
    }
    // A stranger is offered to sign in for one.
    let (status, page) = app.browser().get_text(&flipped).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(page.contains("Sign in to send a new link"), "{page}");
    assert_eq!(confirmed_accounts(&app), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_link_at_most_every_five_minutes() {
    let app = spawn_app().await;
    let email = unique_email("grace");
    let customer = app.unconfirmed_customer(&email).await;
    let links = |app: &TestApp| {
        app.db.count(&format!(
            "SELECT count(*) AS n FROM mail_outbox WHERE kind = 'confirm-address' \
             AND customer_id = {}",
            customer_id(app, &email)
        ))
    };
    let orders = customer.get_text("/orders").await.1;
    assert!(orders.contains("Send the link again"), "{orders}");

    // The sign-up's link is seconds old.
    let response = customer.post_form("/account/email/resend", &[]).await;
    let page = expect_page(
        response,
        StatusCode::TOO_MANY_REQUESTS,
        "no new one was sent",
    )
    .await;
    assert!(page.contains("less than 5 minutes ago"), "{page}");
    assert_eq!(links(&app), 1);

    // Without the form's token nothing is sent, however long ago.
    diesel::RunQueryDsl::execute(
        diesel::sql_query("UPDATE mail_outbox SET created_at = now() - interval '6 minutes'"),
        &mut app.db.conn(),
    )
    .unwrap();
    let forged = customer
        .post("/account/email/resend", &[("csrf_token", "forged")])
        .await;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    assert_eq!(links(&app), 1);

    // Two at once after five minutes: one new link. (A second later than
    // the sign-up's, whose event key names its second.)
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (a, b) = tokio::join!(
        customer.post_form("/account/email/resend", &[]),
        customer.post_form("/account/email/resend", &[])
    );
    let mut statuses = [a.status(), b.status()];
    statuses.sort();
    assert_eq!(
        statuses,
        [StatusCode::SEE_OTHER, StatusCode::TOO_MANY_REQUESTS]
    );
    assert_eq!(links(&app), 2);
    let page = customer.get_text("/account/email").await.1;
    assert!(page.contains("is not confirmed yet"), "{page}");

    // The newest link confirms.
    let (status, _) = app.browser().get_text(&link_of(&app, &email).await).await;
    assert_eq!(status, StatusCode::OK);
    let response = customer.post_form("/account/email/resend", &[]).await;
    expect_redirect(&response, "/account/email");
    assert_eq!(links(&app), 2, "a confirmed account gets no new link");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paid_declined_refunded_and_your_turn_each_send_one_message() {
    let smtp = SmtpServer::start();
    let app = app_sending_to(&smtp).await;
    let buyer_email = unique_email("buyer");
    let buyer = app.unconfirmed_customer(&buyer_email).await;
    let product = app.product(10, None).await;

    // Paid.
    let paid = order_id_from(&buyer.buy(product, 1).await);
    let response = buyer.pay(paid, GOOD_CARD).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    // Declined once (the order keeps its units for another card).
    let declined = order_id_from(&buyer.buy(product, 1).await);
    let response = buyer.pay(declined, DECLINED_CARD).await;
    assert!(response.status().is_client_error() || response.status().is_redirection());
    // Refunded by an admin.
    let admin = app.admin().await;
    let response = admin
        .post_form(
            &format!("/admin/orders/{paid}/refund"),
            &[("idempotency_key", "refund-mail")],
        )
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);

    // Your turn: a confirmed customer waits in a room whose sale starts.
    let waiter_email = unique_email("waiter");
    app.customer(&waiter_email).await;
    let queued = app.product(3, Some(1)).await;
    diesel::RunQueryDsl::execute(
        diesel::sql_query(format!(
            "UPDATE products SET queue_mode = true, sale_starts_at = now() + interval '1 hour', \
             queue_opens_at = now() - interval '1 minute', name = 'Signed vinyl' WHERE id = {queued}"
        )),
        &mut app.db.conn(),
    )
    .unwrap();
    flashsale::services::sale_cache::invalidate();
    let waiter = CustomerId(customer_id(&app, &waiter_email));
    waiting_room::join(&app.shop, waiter, ProductId(queued))
        .await
        .unwrap();
    diesel::RunQueryDsl::execute(
        diesel::sql_query(format!(
            "UPDATE products SET sale_starts_at = clock_timestamp() WHERE id = {queued}"
        )),
        &mut app.db.conn(),
    )
    .unwrap();
    flashsale::services::sale_cache::invalidate();
    let deadline = Instant::now() + Duration::from_secs(20);
    while app.db.count(&format!(
        "SELECT count(*) AS n FROM queue_admissions WHERE product_id = {queued}"
    )) == 0
    {
        assert!(Instant::now() < deadline, "no pass was issued");
        waiting_room::run_once(&app.shop).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // More ticks issue nothing new, and write nothing new.
    waiting_room::run_once(&app.shop).await.unwrap();

    wait_until_all_sent(&app, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let received = smtp.received();
    // Two sign-ups, the admin made by the test (no mail), and four events.
    assert_eq!(received.len(), 6, "{received:#?}");

    let paid_mail = with_subject(&received, &buyer_email, &format!("Order #{paid} is paid"));
    assert_eq!(paid_mail.len(), 1, "{received:#?}");
    assert!(
        paid_mail[0].body.contains("$10.00"),
        "{}",
        paid_mail[0].body
    );
    assert_eq!(
        paid_mail[0].message_id(),
        format!("<order-paid.{paid}@flashsale.test>")
    );

    let declined_mail = with_subject(
        &received,
        &buyer_email,
        &format!("Payment declined for order #{declined}"),
    );
    assert_eq!(declined_mail.len(), 1, "{received:#?}");
    assert!(
        declined_mail[0].body.contains("you were not charged")
            && declined_mail[0].body.contains("2 more tries"),
        "{}",
        declined_mail[0].body
    );

    let refund_mail = with_subject(
        &received,
        &buyer_email,
        &format!("Refund for order #{paid}"),
    );
    assert_eq!(refund_mail.len(), 1, "{received:#?}");
    assert!(
        refund_mail[0].body.contains("$10.00 goes back"),
        "{}",
        refund_mail[0].body
    );

    let turn_mail = with_subject(&received, &waiter_email, "It's your turn: Signed vinyl");
    assert_eq!(turn_mail.len(), 1, "{received:#?}");
    let expires: chrono::DateTime<chrono::Utc> = diesel::RunQueryDsl::get_result::<Deadline>(
        diesel::sql_query(format!(
            "SELECT expires_at AS at FROM queue_admissions WHERE product_id = {queued}"
        )),
        &mut app.db.conn(),
    )
    .unwrap()
    .at;
    let deadline_words = expires.format("%Y-%m-%d %H:%M:%S").to_string();
    assert!(
        turn_mail[0]
            .body
            .contains(&format!("Your turn lasts until {deadline_words} (UTC)")),
        "{}",
        turn_mail[0].body
    );

    let ids: HashSet<&str> = received.iter().map(ReceivedMail::message_id).collect();
    assert_eq!(ids.len(), received.len(), "a Message-ID came twice");
}

#[derive(diesel::QueryableByName)]
struct Deadline {
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    at: chrono::DateTime<chrono::Utc>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn smtp_down_for_a_minute_then_back_delivers_every_message_once() {
    let mut smtp = SmtpServer::stopped();
    let app = app_sending_to(&smtp).await;
    let outage = Instant::now();
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let customers = app.customers(3, &format!("outage-{tag}-")).await;
    let product = app.product(5, None).await;
    let order = order_id_from(&customers[0].buy(product, 1).await);
    assert_eq!(
        customers[0].pay(order, GOOD_CARD).await.status(),
        StatusCode::SEE_OTHER
    );
    let written = app.db.count("SELECT count(*) AS n FROM mail_outbox");
    assert_eq!(written, 4);

    // Every message is tried and fails while the server is down.
    let deadline = Instant::now() + Duration::from_secs(20);
    while app.db.count(
        "SELECT count(*) AS n FROM mail_outbox WHERE attempts > 0 AND last_error IS NOT NULL",
    ) < written
    {
        assert!(Instant::now() < deadline, "messages were not tried");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let admin = app.admin().await;
    let page = admin.get_text("/admin/mail").await.1;
    assert!(page.contains("Not delivered yet"), "{page}");
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM mail_outbox WHERE sent_at IS NOT NULL"),
        0
    );

    let down_for = Duration::from_secs(60);
    tokio::time::sleep(down_for.saturating_sub(outage.elapsed())).await;
    assert!(smtp.received().is_empty());
    smtp.resume(Answering::AtOnce);
    let back = Instant::now();

    // Pauses grow to a minute at most: all are delivered within about that.
    wait_until_all_sent(&app, Duration::from_secs(90)).await;
    eprintln!("delivered {:?} after the server came back", back.elapsed());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let received = smtp.received();
    assert_eq!(received.len() as i64, written, "{received:#?}");
    let ids: HashSet<&str> = received.iter().map(ReceivedMail::message_id).collect();
    assert_eq!(
        ids.len() as i64,
        written,
        "a message came twice: {received:#?}"
    );
    let keys: Vec<String> = diesel::RunQueryDsl::load::<EventKey>(
        diesel::sql_query("SELECT event_key FROM mail_outbox"),
        &mut app.db.conn(),
    )
    .unwrap()
    .into_iter()
    .map(|k| sender::message_id(&k.event_key, "flashsale.test"))
    .collect();
    assert_eq!(ids, keys.iter().map(String::as_str).collect::<HashSet<_>>());
    let page = admin.get_text("/admin/mail").await.1;
    assert!(!page.contains("Not delivered yet"), "{page}");
}

#[derive(diesel::QueryableByName)]
struct EventKey {
    #[diesel(sql_type = diesel::sql_types::Text)]
    event_key: String,
}

/// `kill -9` of the sending process after the server stored the message and
/// before it answered (`slow_mailbox.py` waits 4 s before its 250): the row
/// stays unsent, and the next sender (after the dead one's lease) sends it
/// again under the same Message-ID, then marks it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sender_crashed_between_send_and_mark_resends_the_same_message_id() {
    let mut smtp = SmtpServer::stopped();
    smtp.resume(Answering::After { seconds: 4 });
    // The in-process app has no mail server: only the processes below send.
    let app = spawn_app().await;
    let email = unique_email("crash");
    app.unconfirmed_customer(&email).await;
    let key_hex = hex::encode(&app.settings.session_key);
    let smtp_url = smtp.url();
    let env = [("SMTP_URL", smtp_url.as_str()), ("MAIL_INTERVAL_MS", "100")];

    let mut first =
        start_server_process(&app.db.url, &app.settings.redis_key_prefix, &key_hex, &env);
    let stored = smtp.wait_for(1, Duration::from_secs(20)).await;
    assert_eq!(stored.len(), 1, "the first sender delivered nothing");
    first.guard.kill();
    let killed_at = Instant::now();
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM mail_outbox WHERE sent_at IS NULL"),
        1,
        "the killed sender marked the message sent before its answer"
    );

    let _second = start_server_process(&app.db.url, &app.settings.redis_key_prefix, &key_hex, &env);
    wait_until_all_sent(&app, Duration::from_secs(60)).await;
    assert!(
        killed_at.elapsed() >= sender::LEASE - Duration::from_secs(1),
        "resent before the dead sender's lease ran out"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let received = smtp.received();
    assert_eq!(received.len(), 2, "{received:#?}");
    assert_eq!(received[0].message_id(), received[1].message_id());
    assert_eq!(received[0].body, received[1].body);
    assert_eq!(
        app.db
            .count("SELECT attempts::bigint AS n FROM mail_outbox"),
        1,
        "one recorded try: the killed one never came back"
    );
}

/// A message the server refuses for good (550: no such mailbox) is given
/// up at once, never tried again, and shown to the admin with the server's
/// words; the messages after it still go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_refused_for_good_is_not_retried_and_the_rest_go_out() {
    let mut smtp = SmtpServer::stopped();
    smtp.resume(Answering::RefusingSome);
    let app = app_sending_to(&smtp).await;
    let nobody = unique_email("refused-nobody");
    let ada = unique_email("ada");
    app.unconfirmed_customer(&nobody).await;
    app.unconfirmed_customer(&ada).await;

    let deadline = Instant::now() + Duration::from_secs(20);
    while app.db.count(
        "SELECT count(*) AS n FROM mail_outbox WHERE sent_at IS NOT NULL OR refused_at IS NOT NULL",
    ) < 2
    {
        assert!(
            Instant::now() < deadline,
            "the two messages were not settled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // More runs (the job's and these) do not try it again.
    for _ in 0..3 {
        sender::run_once(&app.shop).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        app.db.count(&format!(
            "SELECT attempts::bigint AS n FROM mail_outbox m JOIN customers c ON c.id = m.customer_id \
             WHERE c.email = '{nobody}' AND m.refused_at IS NOT NULL AND m.sent_at IS NULL"
        )),
        1
    );
    let received = smtp.received();
    assert_eq!(received.len(), 1, "{received:#?}");
    assert!(received[0].header("to").contains(&ada));

    let (_, page) = app.admin().await.get_text("/admin/mail").await;
    assert!(page.contains("Refused"), "{page}");
    assert!(page.contains("refused it for good"), "{page}");
    assert!(page.contains("No such mailbox here"), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_mail_server_messages_wait_for_the_admin_to_read() {
    let app = spawn_app().await;
    let email = unique_email("demo");
    let customer = app.unconfirmed_customer(&email).await;
    assert_eq!(
        sender::run_once(&app.shop).await.unwrap(),
        sender::MailReport::default()
    );
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM mail_outbox WHERE sent_at IS NULL AND attempts = 0"),
        1
    );

    let (status, _) = customer.get_text("/admin/mail").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let admin = app.admin().await;
    let dashboard = admin.get_text("/admin").await.1;
    assert!(
        dashboard.contains("href=\"/admin/mail\""),
        "no link in the admin menu"
    );
    let (status, page) = admin.get_text("/admin/mail").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("No mail server is set up"), "{page}");
    assert!(
        page.contains(&email) && page.contains("Address confirmation"),
        "{page}"
    );
    assert!(page.contains("Waiting"), "{page}");
    let start = page
        .find("/account/confirm?")
        .expect("the link is on the page");
    let rest = &page[start..];
    let link = rest[..rest.find(char::is_whitespace).unwrap()]
        .replace("&amp;", "&")
        .replace("&#38;", "&");
    let (status, confirmed) = app.browser().get_text(&link).await;
    assert_eq!(status, StatusCode::OK, "{confirmed}");
    assert!(is_confirmed(&app, &email));
}

#[derive(diesel::QueryableByName)]
struct Filled {
    #[diesel(sql_type = diesel::sql_types::Text)]
    email: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    email_canonical: String,
}

/// The migration fills `email_canonical` of the accounts made before it in
/// SQL; run on such accounts, its statement agrees with the shop's rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_migrations_fill_agrees_with_the_canonical_rule() {
    use diesel::RunQueryDsl;
    let app = spawn_app().await;
    let up = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/2026-12-07-000000_customer_mail/up.sql"
    ))
    .unwrap();
    let start = up.find("UPDATE customers SET email_canonical").unwrap();
    let fill = &up[start..start + up[start..].find(';').unwrap()];
    let mut conn = app.db.conn();
    for email in [
        "x.y+z@googlemail.com",
        "x.y+z@example.org",
        "a.da.l+x@gmail.com",
        "ada+a.b@example.com",
        "a.da@mail.gmail.com",
        "plain@example.net",
    ] {
        diesel::sql_query(format!(
            "INSERT INTO customers (email, password_hash) VALUES ('{email}', 'x')"
        ))
        .execute(&mut conn)
        .unwrap();
    }
    diesel::sql_query(fill).execute(&mut conn).unwrap();
    let filled: Vec<Filled> = diesel::sql_query("SELECT email, email_canonical FROM customers")
        .load(&mut conn)
        .unwrap();
    assert_eq!(filled.len(), 6);
    for row in filled {
        assert_eq!(
            row.email_canonical,
            flashsale::domain::canonical_address(&row.email),
            "{}",
            row.email
        );
    }
}
