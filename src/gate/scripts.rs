//! The gate's Lua scripts. Each runs atomically on one Redis slot (every key
//! a script touches carries the product's hash tag), so an admission, a
//! give-back or a resync is never seen half done by another instance.

/// Admit a batch of buyers of one product, one after another in the order
/// given, each exactly as if it had been sent alone: the script is atomic,
/// so the product's stock and limit are read once and the stock is then
/// followed here as the batch takes units. Each buyer, in this order: first
/// the request's answer record, when the request carries an idempotency
/// key: a key used for a different request is refused; a key whose request
/// was refused gets that refusal again; a key whose request was admitted
/// says so (its purchase is on its way to Postgres, or there). Then a
/// repeat of an admitted admission gets its earlier answer (before any
/// stock check, so a repeat never takes stock); an unknown stock key means
/// no; too little stock means no; then the customer's limit (the order
/// Postgres checks them in, so both give a buyer the same refusal); else
/// take the units, remember the admission with its fingerprint, and list it
/// as pending (admitted, not yet written to Postgres nor given back) with
/// the time it was admitted. Pending members read
/// `admission|customer|units`, so a resync can tell whose units are still
/// on their way. A refusal here is recorded under the request's key in the
/// same step, so its replay needs nothing but this script.
///
/// Answer records read `R|fingerprint|S|available` (sold out),
/// `R|fingerprint|L|held|limit` (limit reached), `R|fingerprint|J|json` (a
/// refusal decided in Postgres, see RECORD_REFUSAL) and
/// `A|fingerprint|admission|admitted at (ms)`.
///
/// What a sold-out crowd sends is mostly this script's arguments, and
/// Redis's cost per argument and per reply element is most of a refusal's:
/// so what all buyers share goes once, and each buyer's answer is one text.
///
/// KEYS: stock, limit, the per-customer holdings hash, the pending set,
/// then for each buyer: the admission's marker, its return marker and its
/// answer record (the marker again for a request without a key, unused).
/// ARGV: the number of buyers, the marker TTL (ms), how long an admission
/// is kept (ms), then for each buyer: units, customer, admission, the
/// request's fingerprint (empty without a key) and how long a refusal is
/// kept (ms).
/// Returns one `code|a|b|text` per buyer: 0 admitted, 1 repeat, 2 sold out
/// (a = available), 3 limit reached (a = held, b = limit), 4 admission
/// conflict, 5 unknown product, 6 key used for another request, 7 refused
/// before (text = the record's refusal part), 8 admitted before (a = age in
/// ms, text = that admission); -1 for a buyer's arguments it cannot read,
/// and an error for the whole call when the batch's own are unreadable.
pub(super) const ADMIT: &str = r#"
local n = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local admitted_ttl = tonumber(ARGV[3])
local out = {}
if n == nil or ttl == nil or ttl < 1 or admitted_ttl == nil or admitted_ttl < 1 then
  return redis.error_reply('ADMIT: unreadable batch arguments')
end
local product = redis.call('MGET', KEYS[1], KEYS[2])
-- Redis's own integer text until the batch takes units: formatting the
-- number again costs more than the rest of a refusal.
local stock_text = product[1]
local stock = tonumber(stock_text)
local limit = tonumber(product[2] or '0') or 0
-- Only an admission, or a repeat of one, needs the clock, once per batch
-- (the batch is one atomic step): a refusal does not ask for it.
local now
local function now_ms()
  if not now then
    local time = redis.call('TIME')
    now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  end
  return now
end
local function one(marker_key, return_key, record_key, qty, customer, admission, request, refusal_ttl)
  if qty == nil or qty < 1 or qty ~= math.floor(qty) or customer == nil or customer == '' or admission == nil or admission == '' or request == nil then
    return '-1|0|0|'
  end
  local recorded = request ~= ''
  local got
  if recorded then
    if refusal_ttl == nil or refusal_ttl < 1 then return '-1|0|0|' end
    got = redis.call('MGET', return_key, marker_key, record_key)
    local record = got[3]
    if record then
      local kind, fingerprint, rest = string.match(record, '^(%a)|([^|]*)|(.*)$')
      if fingerprint ~= request then return '6|0|0|' end
      if kind == 'R' then return '7|0|0|' .. rest end
      local earlier, at = string.match(rest, '^([^|]*)|(%d+)$')
      -- This very admission, sent again because its reply was lost.
      if earlier == admission then return '1|0|0|' end
      local age = now_ms() - (tonumber(at) or now_ms())
      return '8|' .. string.format('%d', age) .. '|0|' .. (earlier or '')
    end
  else
    got = redis.call('MGET', return_key, marker_key)
  end
  -- A first attempt finds neither of its admission's markers.
  -- A give-back that overtook its own admission (the admission's reply
  -- timed out, so it was given back on another connection) left a
  -- tombstone: the late admission must not take units nobody will return.
  if got[1] then return '4|0|0|' end
  local marker = customer .. ':' .. qty
  if got[2] then
    if got[2] == marker then return '1|0|0|' end
    return '4|0|0|'
  end
  if not stock then return '5|0|0|' end
  if stock < qty then
    if recorded then
      redis.call('SET', record_key, 'R|' .. request .. '|S|' .. stock_text, 'PX', refusal_ttl)
    end
    return '2|' .. stock_text .. '|0|'
  end
  if limit > 0 then
    local held = tonumber(redis.call('HGET', KEYS[3], customer) or '0')
    if held + qty > limit then
      if recorded then
        redis.call('SET', record_key, 'R|' .. request .. '|L|' .. held .. '|' .. limit, 'PX', refusal_ttl)
      end
      return '3|' .. held .. '|' .. limit .. '|'
    end
  end
  local at = now_ms()
  stock = redis.call('DECRBY', KEYS[1], qty)
  stock_text = tostring(stock)
  redis.call('SET', marker_key, marker, 'PX', ttl)
  redis.call('ZADD', KEYS[4], at, admission .. '|' .. customer .. '|' .. qty)
  redis.call('PEXPIRE', KEYS[4], ttl)
  if limit > 0 then
    redis.call('HINCRBY', KEYS[3], customer, qty)
    redis.call('PEXPIRE', KEYS[3], ttl)
  end
  if recorded then
    redis.call('SET', record_key, 'A|' .. request .. '|' .. admission .. '|' .. string.format('%d', at), 'PX', admitted_ttl)
  end
  return '0|' .. stock_text .. '|0|'
end
for i = 1, n do
  local k, a = 4 + 3 * (i - 1), 3 + 5 * (i - 1)
  out[i] = one(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], tonumber(ARGV[a + 5]))
end
return out
"#;

/// A request admitted under its key was refused in Postgres (the sale not
/// open, fewer units than the gate thought, the limit over live orders):
/// its answer record becomes that refusal, so a replay gets it again. Only
/// while the record still names this admission: a record that has moved on
/// (taken over by a resend) is not this request's to change.
///
/// KEYS: the answer record. ARGV: the admission, the refusal as JSON, how
/// long it is kept (ms). Returns 1 if recorded, 0 if not.
pub(super) const RECORD_REFUSAL: &str = r#"
local record = redis.call('GET', KEYS[1])
if not record then return 0 end
local fingerprint, admission = string.match(record, '^A|([^|]*)|([^|]*)|%d+$')
if admission ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], 'R|' .. fingerprint .. '|J|' .. ARGV[2], 'PX', tonumber(ARGV[3]))
return 1
"#;

/// A request admitted under its key changed nothing (it failed closed, or
/// its admission was abandoned): its answer record goes, so the same form
/// can be sent again. Only while the record still names this admission.
///
/// KEYS: the answer record. ARGV: the admission. Returns 1 if forgotten.
pub(super) const FORGET_ADMISSION: &str = r#"
local record = redis.call('GET', KEYS[1])
if not record then return 0 end
local admission = string.match(record, '^A|[^|]*|([^|]*)|%d+$')
if admission ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"#;

/// Give back an admission's units, once: only if the admission marker exists
/// and no return marker does. It is no longer pending, and its customer
/// holds its units no more. The customer is the one the marker names, so a
/// give-back cannot lower someone else's count.
///
/// KEYS: stock, the admission's marker, its return marker, the per-customer
/// holdings hash, the pending set.
pub(super) const GIVE_BACK: &str = r#"
local ttl = tonumber(ARGV[1])
local admission = ARGV[2]
if ttl == nil or ttl < 1 or admission == nil then return -1 end
local admitted = redis.call('GET', KEYS[2])
if not admitted then
  -- Nothing to give back yet; remember that it was given up on, so an
  -- admission arriving late is refused instead of taking units for good.
  redis.call('SET', KEYS[3], '1', 'PX', ttl)
  return 0
end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local customer, qty = string.match(admitted, '^(.*):(%d+)$')
qty = tonumber(qty)
if qty == nil then return -1 end
redis.call('SET', KEYS[3], '1', 'PX', ttl)
-- Members written before pending entries named their customer read
-- `admission|units`.
redis.call('ZREM', KEYS[5], admission .. '|' .. customer .. '|' .. qty, admission .. '|' .. qty)
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], qty) end
local held = tonumber(redis.call('HGET', KEYS[4], customer) or '0')
if held > qty then
  redis.call('HINCRBY', KEYS[4], customer, -qty)
elseif held > 0 then
  redis.call('HDEL', KEYS[4], customer)
end
return qty
"#;

/// Sets the gate from the database: the stock Postgres holds less the units
/// of admissions still pending, after dropping pending admissions older than
/// the longest a live one can take (their buyer is gone: a crash, a lost
/// give-back), so their units come back. With a limit, each customer's
/// holdings become what their live orders hold (ARGV from the sixth on:
/// customer, units, ...; the fifth is the start of the return markers'
/// names) plus their pending admissions, so a lost give-back
/// cannot lock a customer out. Returns the stock before (-1 if there was
/// none), the stock now, the pending units counted, and how many customers'
/// holdings were corrected.
///
/// KEYS: stock, limit, the pending set, the per-customer holdings hash.
pub(super) const RESYNC: &str = r#"
local stock = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local stale = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
if stock == nil or limit == nil or stale == nil or ttl == nil or ttl < 1 then return {-2, 0, 0, 0} end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
-- An admission dropped here is counted as given back (its units return
-- with the database's stock), so its own give-back, if it ever comes, must
-- not return them a second time: it finds its return marker.
local ret_prefix = ARGV[5]
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now_ms - stale))) do
  local dropped = string.match(member, '^([^|]*)|')
  if dropped then redis.call('SET', ret_prefix .. dropped, '1', 'PX', ttl) end
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now_ms - stale))
local pending = 0
local held = {}
for _, member in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  -- Members written before they named their customer read `admission|units`.
  local qty = tonumber(string.match(member, '|(%d+)$')) or 0
  local customer = string.match(member, '^[^|]*|([^|]*)|%d+$')
  pending = pending + qty
  if customer then held[customer] = (held[customer] or 0) + qty end
end
local before = tonumber(redis.call('GET', KEYS[1]) or '-1')
local now_stock = math.max(0, stock - pending)
redis.call('SET', KEYS[1], now_stock)
redis.call('SET', KEYS[2], limit)
local was = {}
local flat = redis.call('HGETALL', KEYS[4])
for i = 1, #flat, 2 do was[flat[i]] = tonumber(flat[i + 1]) end
redis.call('DEL', KEYS[4])
local corrected = 0
if limit > 0 then
  for i = 6, #ARGV, 2 do
    held[ARGV[i]] = (held[ARGV[i]] or 0) + (tonumber(ARGV[i + 1]) or 0)
  end
  for customer, units in pairs(held) do
    if units > 0 then redis.call('HSET', KEYS[4], customer, units) end
    if (was[customer] or 0) ~= units then corrected = corrected + 1 end
    was[customer] = nil
  end
  redis.call('PEXPIRE', KEYS[4], ttl)
end
for _, units in pairs(was) do
  if units ~= 0 then corrected = corrected + 1 end
end
return {before, now_stock, pending, corrected}
"#;
