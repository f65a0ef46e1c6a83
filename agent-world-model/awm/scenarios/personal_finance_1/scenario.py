"""personal_finance_1: a personal banking app (accounts, payees, transfers, budgets, bill pay)."""

from functools import partial

from awm.scenarios.verifier_kit import (
    ANSWER_TEXT,
    DIFF_ROWS,
    MENTIONS_AMOUNT,
    NUMBERS,
    ONLY_CHANGED,
    SAME_MONEY,
    TABLE_BY_ID,
    UNCHANGED_BY_DIFF,
    prelude,
    verifier,
)

NAME = "personal_finance_1"

DESCRIPTION = (
    "ClearLedger is a personal online banking app for a single signed-in customer. The customer holds "
    "several accounts at the bank: an everyday checking account, savings pots such as an emergency fund "
    "and a vacation fund, a rewards credit card and an old checking account that has been closed. Every "
    "account shows its current balance; a negative balance on the credit card is the amount owed. Each "
    "account has a statement of posted transactions with a signed amount, a description, a spending "
    "category (Groceries, Dining, Utilities, Housing, Shopping, Entertainment, Income, Transfer ...) and, "
    "for bill and card payments, a link to a saved payee. Customers keep a list of saved payees with a "
    "default category and their customer number at the payee, can add new payees and delete payees that "
    "were never used. Money moves between the customer's own accounts through internal transfers: a "
    "transfer debits an open checking or savings account, credits another open account (paying down the "
    "card when the target is the credit card), writes a matching pair of transactions and is refused when "
    "the source balance is too low. A completed transfer that went to the wrong place can be reversed, "
    "which returns the money and marks the transfer reversed. Monthly budgets per spending category carry "
    "a limit and an alert threshold in percent. Bill pay lets the customer schedule one-off, weekly or "
    "monthly payments from an account to a saved payee with a next run date, pause and resume them, "
    "change their amount or date, and cancel them. Typical work: checking balances and spending, moving "
    "money, fixing mistaken transfers, tidying budgets, recategorizing card charges and managing "
    "scheduled bills."
)

TABLES = [
    {
        "name": "users",
        "ddl": (
            "CREATE TABLE users (id INTEGER PRIMARY KEY, full_name TEXT NOT NULL, email TEXT NOT NULL UNIQUE, "
            "phone TEXT, created_at DATETIME DEFAULT CURRENT_TIMESTAMP);"
        ),
        "indexes": [],
    },
    {
        "name": "accounts",
        "ddl": (
            "CREATE TABLE accounts (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, name TEXT NOT NULL, "
            "account_type TEXT NOT NULL CHECK (account_type IN ('checking', 'savings', 'credit')), "
            "account_number_last4 TEXT NOT NULL, balance REAL NOT NULL DEFAULT 0, "
            "currency TEXT NOT NULL DEFAULT 'USD', "
            "status TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed')), "
            "created_at DATETIME DEFAULT CURRENT_TIMESTAMP, updated_at DATETIME DEFAULT CURRENT_TIMESTAMP, "
            "FOREIGN KEY (user_id) REFERENCES users(id));"
        ),
        "indexes": ["CREATE INDEX ix_accounts_user_id ON accounts(user_id);"],
    },
    {
        "name": "payees",
        "ddl": (
            "CREATE TABLE payees (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, name TEXT NOT NULL, "
            "category TEXT NOT NULL DEFAULT 'General', account_number TEXT, "
            "created_at DATETIME DEFAULT CURRENT_TIMESTAMP, FOREIGN KEY (user_id) REFERENCES users(id));"
        ),
        "indexes": [
            "CREATE INDEX ix_payees_user_id ON payees(user_id);",
            "CREATE INDEX idx_payees_user_name ON payees(user_id, name);",
        ],
    },
    {
        "name": "transfers",
        "ddl": (
            "CREATE TABLE transfers (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, "
            "from_account_id INTEGER NOT NULL, to_account_id INTEGER NOT NULL, "
            "amount REAL NOT NULL CHECK (amount > 0), memo TEXT, "
            "status TEXT NOT NULL DEFAULT 'completed' CHECK (status IN ('completed', 'reversed')), "
            "reversal_reason TEXT, reversed_at DATETIME, created_at DATETIME DEFAULT CURRENT_TIMESTAMP, "
            "CHECK (from_account_id <> to_account_id), "
            "FOREIGN KEY (user_id) REFERENCES users(id), "
            "FOREIGN KEY (from_account_id) REFERENCES accounts(id), "
            "FOREIGN KEY (to_account_id) REFERENCES accounts(id));"
        ),
        "indexes": [
            "CREATE INDEX ix_transfers_user_id ON transfers(user_id);",
            "CREATE INDEX idx_transfers_from_account ON transfers(from_account_id);",
            "CREATE INDEX idx_transfers_to_account ON transfers(to_account_id);",
        ],
    },
    {
        "name": "transactions",
        "ddl": (
            "CREATE TABLE transactions (id INTEGER PRIMARY KEY, account_id INTEGER NOT NULL, "
            "amount REAL NOT NULL, description TEXT NOT NULL, "
            "category TEXT NOT NULL DEFAULT 'Uncategorized', payee_id INTEGER, transfer_id INTEGER, "
            "posted_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP, "
            "created_at DATETIME DEFAULT CURRENT_TIMESTAMP, updated_at DATETIME DEFAULT CURRENT_TIMESTAMP, "
            "FOREIGN KEY (account_id) REFERENCES accounts(id), "
            "FOREIGN KEY (payee_id) REFERENCES payees(id), "
            "FOREIGN KEY (transfer_id) REFERENCES transfers(id));"
        ),
        "indexes": [
            "CREATE INDEX idx_transactions_account_posted ON transactions(account_id, posted_at);",
            "CREATE INDEX idx_transactions_payee ON transactions(payee_id);",
            "CREATE INDEX idx_transactions_category ON transactions(category);",
        ],
    },
    {
        "name": "budgets",
        "ddl": (
            "CREATE TABLE budgets (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, category TEXT NOT NULL, "
            "monthly_limit REAL NOT NULL CHECK (monthly_limit >= 0), "
            "alert_threshold_pct INTEGER NOT NULL DEFAULT 80 CHECK (alert_threshold_pct BETWEEN 1 AND 100), "
            "created_at DATETIME DEFAULT CURRENT_TIMESTAMP, updated_at DATETIME DEFAULT CURRENT_TIMESTAMP, "
            "UNIQUE (user_id, category), FOREIGN KEY (user_id) REFERENCES users(id));"
        ),
        "indexes": [],
    },
    {
        "name": "scheduled_payments",
        "ddl": (
            "CREATE TABLE scheduled_payments (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, "
            "account_id INTEGER NOT NULL, payee_id INTEGER NOT NULL, amount REAL NOT NULL CHECK (amount > 0), "
            "frequency TEXT NOT NULL CHECK (frequency IN ('once', 'weekly', 'monthly')), "
            "next_run_date DATE NOT NULL, "
            "status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'paused', 'cancelled')), "
            "memo TEXT, created_at DATETIME DEFAULT CURRENT_TIMESTAMP, updated_at DATETIME DEFAULT CURRENT_TIMESTAMP, "
            "FOREIGN KEY (user_id) REFERENCES users(id), FOREIGN KEY (account_id) REFERENCES accounts(id), "
            "FOREIGN KEY (payee_id) REFERENCES payees(id));"
        ),
        "indexes": [
            "CREATE INDEX idx_scheduled_payments_user_status ON scheduled_payments(user_id, status);",
            "CREATE INDEX idx_scheduled_payments_next_run ON scheduled_payments(next_run_date);",
        ],
    },
]

SAMPLE = [
    {
        "table_name": "users",
        "reasoning": "The signed-in customer (user 1) and a second customer whose data must never show up for user 1.",
        "insert_statements": [
            "INSERT INTO users (id, full_name, email, phone, created_at) VALUES (1, 'Dana Whitfield', 'dana.whitfield@example.com', '+1-555-0142', datetime('now', '-900 days'));",
            "INSERT INTO users (id, full_name, email, phone, created_at) VALUES (2, 'Marcus Ortega', 'marcus.ortega@example.com', '+1-555-0199', datetime('now', '-400 days'));",
        ],
    },
    {
        "table_name": "accounts",
        "reasoning": "Checking, two savings pots, a credit card with an owed balance and a closed account for user 1; one account of user 2.",
        "insert_statements": [
            "INSERT INTO accounts (id, user_id, name, account_type, account_number_last4, balance, currency, status, created_at, updated_at) VALUES (1, 1, 'Everyday Checking', 'checking', '4821', 3120.45, 'USD', 'open', datetime('now', '-880 days'), datetime('now', '-1 days'));",
            "INSERT INTO accounts (id, user_id, name, account_type, account_number_last4, balance, currency, status, created_at, updated_at) VALUES (2, 1, 'Emergency Fund', 'savings', '7310', 8400.00, 'USD', 'open', datetime('now', '-860 days'), datetime('now', '-1 days'));",
            "INSERT INTO accounts (id, user_id, name, account_type, account_number_last4, balance, currency, status, created_at, updated_at) VALUES (3, 1, 'Vacation Fund', 'savings', '7344', 1250.00, 'USD', 'open', datetime('now', '-300 days'), datetime('now', '-25 days'));",
            "INSERT INTO accounts (id, user_id, name, account_type, account_number_last4, balance, currency, status, created_at, updated_at) VALUES (4, 1, 'Travel Rewards Card', 'credit', '9056', -642.80, 'USD', 'open', datetime('now', '-700 days'), datetime('now', '-3 days'));",
            "INSERT INTO accounts (id, user_id, name, account_type, account_number_last4, balance, currency, status, created_at, updated_at) VALUES (5, 1, 'Old Student Checking', 'checking', '1177', 0.00, 'USD', 'closed', datetime('now', '-2000 days'), datetime('now', '-850 days'));",
            "INSERT INTO accounts (id, user_id, name, account_type, account_number_last4, balance, currency, status, created_at, updated_at) VALUES (6, 2, 'Marcus Checking', 'checking', '5502', 1500.00, 'USD', 'open', datetime('now', '-390 days'), datetime('now', '-4 days'));",
        ],
    },
    {
        "table_name": "payees",
        "reasoning": "Saved payees for groceries, rent, utilities, dining and streaming; PetPal Supplies is never used so it can be deleted; one payee belongs to user 2.",
        "insert_statements": [
            "INSERT INTO payees (id, user_id, name, category, account_number, created_at) VALUES (1, 1, 'FreshMart Groceries', 'Groceries', 'FM-1001', datetime('now', '-600 days'));",
            "INSERT INTO payees (id, user_id, name, category, account_number, created_at) VALUES (2, 1, 'City Water Utility', 'Utilities', 'CWU-55821', datetime('now', '-800 days'));",
            "INSERT INTO payees (id, user_id, name, category, account_number, created_at) VALUES (3, 1, 'Oakridge Property Management', 'Housing', 'OPM-7740', datetime('now', '-820 days'));",
            "INSERT INTO payees (id, user_id, name, category, account_number, created_at) VALUES (4, 1, 'Bistro Lumiere', 'Dining', 'BL-3302', datetime('now', '-200 days'));",
            "INSERT INTO payees (id, user_id, name, category, account_number, created_at) VALUES (5, 1, 'Northwind Electric', 'Utilities', 'NWE-44120', datetime('now', '-790 days'));",
            "INSERT INTO payees (id, user_id, name, category, account_number, created_at) VALUES (6, 1, 'StreamFlix', 'Entertainment', 'SF-99031', datetime('now', '-365 days'));",
            "INSERT INTO payees (id, user_id, name, category, account_number, created_at) VALUES (7, 1, 'PetPal Supplies', 'Pets', 'PPS-2231', datetime('now', '-20 days'));",
            "INSERT INTO payees (id, user_id, name, category, account_number, created_at) VALUES (8, 2, 'Iron Gym', 'Fitness', 'IG-0042', datetime('now', '-380 days'));",
        ],
    },
    {
        "table_name": "transfers",
        "reasoning": "Past internal transfers; transfer 4 (yesterday, memo says it was for the vacation fund) went to the Emergency Fund by mistake.",
        "insert_statements": [
            "INSERT INTO transfers (id, user_id, from_account_id, to_account_id, amount, memo, status, created_at) VALUES (1, 1, 1, 3, 250.00, 'Vacation savings', 'completed', datetime('now', '-25 days'));",
            "INSERT INTO transfers (id, user_id, from_account_id, to_account_id, amount, memo, status, created_at) VALUES (2, 1, 1, 4, 200.00, 'Card payment', 'completed', datetime('now', '-16 days'));",
            "INSERT INTO transfers (id, user_id, from_account_id, to_account_id, amount, memo, status, created_at) VALUES (3, 1, 1, 2, 500.00, 'Monthly emergency top-up', 'completed', datetime('now', '-30 days'));",
            "INSERT INTO transfers (id, user_id, from_account_id, to_account_id, amount, memo, status, created_at) VALUES (4, 1, 1, 2, 120.00, 'Vacation Fund deposit', 'completed', datetime('now', '-1 days'));",
        ],
    },
    {
        "table_name": "transactions",
        "reasoning": "Statement lines: FreshMart purchases on checking and card (256.25 in total), two Bistro Lumiere charges (the card one miscategorized as Shopping), rent, bills, payroll and the transaction pairs of the four transfers.",
        "insert_statements": [
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (1, 1, -86.40, 'FreshMart Groceries #112', 'Groceries', 1, NULL, datetime('now', '-12 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (2, 1, -54.15, 'FreshMart Groceries #112', 'Groceries', 1, NULL, datetime('now', '-5 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (3, 1, -41.80, 'FreshMart Groceries #087', 'Groceries', 1, NULL, datetime('now', '-2 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (4, 1, -38.00, 'Bistro Lumiere', 'Dining', 4, NULL, datetime('now', '-6 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (5, 1, -1450.00, 'Oakridge Property Management rent', 'Housing', 3, NULL, datetime('now', '-20 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (6, 1, -62.37, 'City Water Utility bill', 'Utilities', 2, NULL, datetime('now', '-15 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (7, 1, 2850.00, 'Payroll deposit ACME CORP', 'Income', NULL, NULL, datetime('now', '-14 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (8, 4, -64.20, 'Bistro Lumiere', 'Shopping', 4, NULL, datetime('now', '-3 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (9, 4, -73.90, 'FreshMart Groceries #087', 'Groceries', 1, NULL, datetime('now', '-8 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (10, 4, -15.99, 'StreamFlix monthly plan', 'Entertainment', 6, NULL, datetime('now', '-10 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (11, 4, -129.50, 'Summit Outdoor Gear', 'Shopping', NULL, NULL, datetime('now', '-9 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (12, 1, -250.00, 'Transfer to Vacation Fund', 'Transfer', NULL, 1, datetime('now', '-25 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (13, 3, 250.00, 'Transfer from Everyday Checking', 'Transfer', NULL, 1, datetime('now', '-25 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (14, 1, -200.00, 'Transfer to Travel Rewards Card', 'Transfer', NULL, 2, datetime('now', '-16 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (15, 4, 200.00, 'Transfer from Everyday Checking', 'Transfer', NULL, 2, datetime('now', '-16 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (16, 1, -500.00, 'Transfer to Emergency Fund', 'Transfer', NULL, 3, datetime('now', '-30 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (17, 2, 500.00, 'Transfer from Everyday Checking', 'Transfer', NULL, 3, datetime('now', '-30 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (18, 1, -120.00, 'Transfer to Emergency Fund', 'Transfer', NULL, 4, datetime('now', '-1 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (19, 2, 120.00, 'Transfer from Everyday Checking', 'Transfer', NULL, 4, datetime('now', '-1 days'));",
            "INSERT INTO transactions (id, account_id, amount, description, category, payee_id, transfer_id, posted_at) VALUES (20, 6, -45.00, 'Iron Gym membership', 'Fitness', 8, NULL, datetime('now', '-4 days'));",
        ],
    },
    {
        "table_name": "budgets",
        "reasoning": "Monthly category budgets of user 1 (no Pets budget yet) and one budget of user 2.",
        "insert_statements": [
            "INSERT INTO budgets (id, user_id, category, monthly_limit, alert_threshold_pct, created_at, updated_at) VALUES (1, 1, 'Groceries', 600.00, 80, datetime('now', '-300 days'), datetime('now', '-60 days'));",
            "INSERT INTO budgets (id, user_id, category, monthly_limit, alert_threshold_pct, created_at, updated_at) VALUES (2, 1, 'Dining', 250.00, 80, datetime('now', '-300 days'), datetime('now', '-300 days'));",
            "INSERT INTO budgets (id, user_id, category, monthly_limit, alert_threshold_pct, created_at, updated_at) VALUES (3, 1, 'Shopping', 300.00, 90, datetime('now', '-250 days'), datetime('now', '-40 days'));",
            "INSERT INTO budgets (id, user_id, category, monthly_limit, alert_threshold_pct, created_at, updated_at) VALUES (4, 1, 'Utilities', 250.00, 80, datetime('now', '-300 days'), datetime('now', '-300 days'));",
            "INSERT INTO budgets (id, user_id, category, monthly_limit, alert_threshold_pct, created_at, updated_at) VALUES (5, 1, 'Entertainment', 60.00, 100, datetime('now', '-120 days'), datetime('now', '-120 days'));",
            "INSERT INTO budgets (id, user_id, category, monthly_limit, alert_threshold_pct, created_at, updated_at) VALUES (6, 2, 'Fitness', 100.00, 80, datetime('now', '-200 days'), datetime('now', '-200 days'));",
        ],
    },
    {
        "table_name": "scheduled_payments",
        "reasoning": "Bill pay: rent (entered twice by mistake, the second one yesterday), water (next active payment), streaming on the card and a paused electric bill that is due earliest.",
        "insert_statements": [
            "INSERT INTO scheduled_payments (id, user_id, account_id, payee_id, amount, frequency, next_run_date, status, memo, created_at, updated_at) VALUES (1, 1, 1, 3, 1450.00, 'monthly', date('now', '+9 days'), 'active', 'Rent', datetime('now', '-200 days'), datetime('now', '-20 days'));",
            "INSERT INTO scheduled_payments (id, user_id, account_id, payee_id, amount, frequency, next_run_date, status, memo, created_at, updated_at) VALUES (2, 1, 1, 2, 62.00, 'monthly', date('now', '+4 days'), 'active', 'Water bill', datetime('now', '-400 days'), datetime('now', '-15 days'));",
            "INSERT INTO scheduled_payments (id, user_id, account_id, payee_id, amount, frequency, next_run_date, status, memo, created_at, updated_at) VALUES (3, 1, 4, 6, 15.99, 'monthly', date('now', '+12 days'), 'active', 'Streaming', datetime('now', '-360 days'), datetime('now', '-10 days'));",
            "INSERT INTO scheduled_payments (id, user_id, account_id, payee_id, amount, frequency, next_run_date, status, memo, created_at, updated_at) VALUES (4, 1, 1, 5, 95.50, 'monthly', date('now', '+2 days'), 'paused', 'Electric bill', datetime('now', '-380 days'), datetime('now', '-30 days'));",
            "INSERT INTO scheduled_payments (id, user_id, account_id, payee_id, amount, frequency, next_run_date, status, memo, created_at, updated_at) VALUES (5, 1, 1, 3, 1450.00, 'monthly', date('now', '+9 days'), 'active', 'Rent', datetime('now', '-1 days'), datetime('now', '-1 days'));",
        ],
    },
]

# ---------------------------------------------------------------------------
# verifiers: self-contained functions, verifier_kit's helpers inlined before each check()
# ---------------------------------------------------------------------------

_verifier = partial(verifier, prelude(
    '''tables = ["users", "accounts", "payees", "transfers", "transactions", "budgets", "scheduled_payments"]''',
    TABLE_BY_ID, DIFF_ROWS, UNCHANGED_BY_DIFF, SAME_MONEY, NUMBERS, MENTIONS_AMOUNT, ONLY_CHANGED))


V_FRESHMART_TOTAL = _verifier(r'''
# info: FreshMart spend over all accounts = 86.40 + 54.15 + 41.80 + 73.90 = 256.25
if not final_answer or not mentions_amount(final_answer, 256.25):
    return False
return unchanged(*tables)
''')

V_NEXT_PAYMENT = _verifier(r'''
# info: the earliest active scheduled payment is City Water Utility, 62.00 (the paused electric bill does not count)
if not final_answer:
    return False
text = final_answer.lower()
if "city water" not in text or not mentions_amount(final_answer, 62.0):
    return False
return unchanged(*tables)
''')

V_LIQUID_BALANCE = _verifier(r'''
# info: open checking + savings = 3120.45 + 8400.00 + 1250.00 = 12770.45
if not final_answer or not mentions_amount(final_answer, 12770.45):
    return False
return unchanged(*tables)
''')

V_TRANSFER_TOPUP = _verifier(r'''
added, removed, changed = diff("transfers")
if removed or changed or len(added) != 1:
    return False
tr = added[0]
if tr["user_id"] != 1 or tr["from_account_id"] != 1 or tr["to_account_id"] != 2:
    return False
if not same_money(tr["amount"], 250.0) or tr["status"] != "completed":
    return False
if (tr["memo"] or "").strip().lower() != "march top-up":
    return False
a_added, a_removed, a_changed = diff("accounts")
if a_added or a_removed or set(a_changed) != {1, 2}:
    return False
for acct_id, delta in ((1, -250.0), (2, 250.0)):
    before, after = a_changed[acct_id]
    if not same_money(after["balance"] - before["balance"], delta):
        return False
    if not only_changed(before, after, {"balance"}):
        return False
t_added, t_removed, t_changed = diff("transactions")
if t_removed or t_changed or len(t_added) != 2:
    return False
legs = sorted((t["account_id"], round(t["amount"], 2)) for t in t_added if t["transfer_id"] == tr["id"])
if legs != [(1, -250.0), (2, 250.0)]:
    return False
return unchanged("users", "payees", "budgets", "scheduled_payments")
''')

V_SOLAR_PAYEE = _verifier(r'''
p_added, p_removed, p_changed = diff("payees")
if p_removed or p_changed or len(p_added) != 1:
    return False
payee = p_added[0]
if payee["user_id"] != 1 or payee["name"].strip().lower() != "greenway solar":
    return False
if (payee["category"] or "").strip().lower() != "utilities":
    return False
if (payee["account_number"] or "").strip().upper() != "GS-88213":
    return False
s_added, s_removed, s_changed = diff("scheduled_payments")
if s_removed or s_changed or len(s_added) != 1:
    return False
sp = s_added[0]
if sp["user_id"] != 1 or sp["payee_id"] != payee["id"] or sp["account_id"] != 1:
    return False
if not same_money(sp["amount"], 89.99) or sp["frequency"] != "monthly" or sp["status"] != "active":
    return False
if str(sp["next_run_date"])[:10] != "2027-03-01":
    return False
return unchanged("users", "accounts", "transfers", "transactions", "budgets")
''')

V_BUDGETS = _verifier(r'''
added, removed, changed = diff("budgets")
if removed or len(added) != 1 or set(changed) != {3}:
    return False
pets = added[0]
if pets["user_id"] != 1 or pets["category"].strip().lower() != "pets":
    return False
if not same_money(pets["monthly_limit"], 150.0) or pets["alert_threshold_pct"] != 75:
    return False
before, after = changed[3]
if not same_money(after["monthly_limit"], 200.0) or after["alert_threshold_pct"] != before["alert_threshold_pct"]:
    return False
if not only_changed(before, after, {"monthly_limit"}):
    return False
return unchanged("users", "accounts", "payees", "transfers", "transactions", "scheduled_payments")
''')

V_PAUSE_STREAMING = _verifier(r'''
added, removed, changed = diff("scheduled_payments")
if added or removed or set(changed) != {3}:
    return False
before, after = changed[3]
if after["status"] != "paused" or not only_changed(before, after, {"status"}):
    return False
return unchanged("users", "accounts", "payees", "transfers", "transactions", "budgets")
''')

V_RECATEGORIZE = _verifier(r'''
added, removed, changed = diff("transactions")
if added or removed or set(changed) != {8}:
    return False
before, after = changed[8]
if (after["category"] or "").strip().lower() != "dining":
    return False
if not only_changed(before, after, {"category"}):
    return False
return unchanged("users", "accounts", "payees", "transfers", "budgets", "scheduled_payments")
''')

V_FIX_WRONG_TRANSFER = _verifier(r'''
# transfer 4 (120.00 to the Emergency Fund by mistake) must be reversed and exactly one new
# completed 120.00 transfer Everyday Checking -> Vacation Fund made; net effect on balances:
# checking 0, Emergency Fund -120, Vacation Fund +120, card untouched.
added, removed, changed = diff("transfers")
if removed or set(changed) != {4} or len(added) != 1:
    return False
before, after = changed[4]
if after["status"] != "reversed":
    return False
if not only_changed(before, after, {"status", "reversal_reason", "reversed_at"}):
    return False
tr = added[0]
if tr["from_account_id"] != 1 or tr["to_account_id"] != 3 or tr["status"] != "completed":
    return False
if not same_money(tr["amount"], 120.0):
    return False
a_added, a_removed, a_changed = diff("accounts")
if a_added or a_removed or not set(a_changed) <= {1, 2, 3}:
    return False
initial = table(initial_db_path, "accounts")
final = table(final_db_path, "accounts")
expected = {1: 0.0, 2: -120.0, 3: 120.0, 4: 0.0, 5: 0.0, 6: 0.0}
for acct_id, delta in expected.items():
    if not same_money(final[acct_id]["balance"] - initial[acct_id]["balance"], delta):
        return False
t_added, t_removed, t_changed = diff("transactions")
if t_removed or t_changed or len(t_added) != 4:
    return False
return unchanged("users", "payees", "budgets", "scheduled_payments")
''')

V_DUPLICATE_RENT = _verifier(r'''
# the rent schedule entered twice: the newer one (id 5) must be cancelled, the original (id 1) kept
added, removed, changed = diff("scheduled_payments")
if added:
    return False
removed_ids = {r["id"] for r in removed}
if removed_ids - {5} or set(changed) - {5}:
    return False
if 5 in changed:
    before, after = changed[5]
    if after["status"] != "cancelled" or not only_changed(before, after, {"status"}):
        return False
elif 5 not in removed_ids:
    return False
final = table(final_db_path, "scheduled_payments")
if final.get(1, {}).get("status") != "active":
    return False
return unchanged("users", "accounts", "payees", "transfers", "transactions", "budgets")
''')


def _call(tool: str, **arguments) -> dict:
    return {"tool": tool, "arguments": arguments}


TASKS = [
    {
        "task": "How much have I spent in total at 'FreshMart Groceries' across all of my accounts, according to my transaction history?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": V_FRESHMART_TOTAL,
        "solution": {
            "calls": [
                _call("search_payees", name="FreshMart"),
                _call("list_accounts"),
                _call("list_account_transactions", account_id=1, payee_id=1),
                _call("list_account_transactions", account_id=2, payee_id=1),
                _call("list_account_transactions", account_id=3, payee_id=1),
                _call("list_account_transactions", account_id=4, payee_id=1),
            ],
            "final_answer": "You have spent $256.25 at FreshMart Groceries in total (182.35 from Everyday Checking and 73.90 on the Travel Rewards Card).",
        },
        "wrong": {
            "calls": [
                _call("list_accounts", account_type="checking"),
                _call("list_account_transactions", account_id=1, search="FreshMart"),
            ],
            "final_answer": "You have spent $182.35 at FreshMart Groceries.",
        },
    },
    {
        "task": "Which payee is my next active scheduled payment going to, and for what amount?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": V_NEXT_PAYMENT,
        "solution": {
            "calls": [_call("list_scheduled_payments", status="active")],
            "final_answer": "Your next active scheduled payment is $62.00 to City Water Utility.",
        },
        "wrong": {
            "calls": [_call("list_scheduled_payments")],
            "final_answer": "The next scheduled payment is $95.50 to Northwind Electric.",
        },
    },
    {
        "task": "What is the combined current balance of all my open checking and savings accounts, leaving out the credit card?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": V_LIQUID_BALANCE,
        "solution": {
            "calls": [_call("list_accounts")],
            "final_answer": "Your open checking and savings accounts hold $12,770.45 in total (3,120.45 + 8,400.00 + 1,250.00).",
        },
        "wrong": {
            "calls": [_call("list_accounts")],
            "final_answer": "Your accounts add up to $12,127.65.",
        },
    },
    {
        "task": "Transfer $250 from my 'Everyday Checking' account to my 'Emergency Fund' with the memo 'March top-up'.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": V_TRANSFER_TOPUP,
        "solution": {
            "calls": [
                _call("list_accounts"),
                _call("create_transfer", from_account_id=1, to_account_id=2, amount=250.0, memo="March top-up"),
            ],
            "final_answer": "Done: $250.00 moved from Everyday Checking to Emergency Fund with memo 'March top-up'.",
        },
        "wrong": {
            "calls": [
                _call("list_accounts"),
                _call("create_transfer", from_account_id=1, to_account_id=3, amount=250.0, memo="March top-up"),
            ],
            "final_answer": "Moved $250 into your fund.",
        },
    },
    {
        "task": "Add a new payee 'Greenway Solar' in the 'Utilities' category with account number 'GS-88213', then schedule a monthly payment of $89.99 to it from my 'Everyday Checking' account with the first payment on 2027-03-01.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": V_SOLAR_PAYEE,
        "solution": {
            "calls": [
                _call("search_payees", name="Greenway"),
                _call("create_payee", name="Greenway Solar", category="Utilities", account_number="GS-88213"),
                _call("list_accounts", account_type="checking"),
                _call("create_scheduled_payment", account_id=1, payee_id=9, amount=89.99, frequency="monthly",
                      next_run_date="2027-03-01", memo="Greenway Solar"),
            ],
            "final_answer": "Greenway Solar is saved as a Utilities payee and a monthly $89.99 payment from Everyday Checking starts on 2027-03-01.",
        },
        "wrong": {
            "calls": [
                _call("create_payee", name="Greenway Solar", category="Utilities", account_number="GS-88213"),
                _call("create_scheduled_payment", account_id=4, payee_id=9, amount=89.99, frequency="monthly",
                      next_run_date="2027-03-01"),
            ],
            "final_answer": "Payee added and monthly payment scheduled.",
        },
    },
    {
        "task": "Create a new 'Pets' budget with a monthly limit of $150 and an alert at 75%, and lower my 'Shopping' budget's monthly limit to $200 without changing its alert threshold.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": V_BUDGETS,
        "solution": {
            "calls": [
                _call("list_budgets"),
                _call("create_budget", category="Pets", monthly_limit=150.0, alert_threshold_pct=75),
                _call("update_budget", budget_id=3, monthly_limit=200.0),
            ],
            "final_answer": "Created the Pets budget ($150/month, alert at 75%) and lowered Shopping to $200/month.",
        },
        "wrong": {
            "calls": [
                _call("create_budget", category="Pets", monthly_limit=150.0),
                _call("update_budget", budget_id=3, monthly_limit=200.0, alert_threshold_pct=80),
            ],
            "final_answer": "Budgets updated.",
        },
    },
    {
        "task": "Pause my scheduled payment to 'StreamFlix' (don't cancel it, I want to resume it later).",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": V_PAUSE_STREAMING,
        "solution": {
            "calls": [
                _call("search_payees", name="StreamFlix"),
                _call("list_scheduled_payments", payee_id=6),
                _call("update_scheduled_payment", payment_id=3, status="paused"),
            ],
            "final_answer": "The StreamFlix scheduled payment is now paused.",
        },
        "wrong": {
            "calls": [
                _call("list_scheduled_payments", status="active"),
                _call("cancel_scheduled_payment", payment_id=3),
            ],
            "final_answer": "Stopped the StreamFlix payment.",
        },
    },
    {
        "task": "The $64.20 'Bistro Lumiere' charge on my 'Travel Rewards Card' is categorized as 'Shopping'; change its category to 'Dining'.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": V_RECATEGORIZE,
        "solution": {
            "calls": [
                _call("list_accounts", account_type="credit"),
                _call("list_account_transactions", account_id=4, search="Bistro"),
                _call("update_transaction_category", transaction_id=8, category="Dining"),
            ],
            "final_answer": "The $64.20 Bistro Lumiere charge on the Travel Rewards Card is now categorized as Dining.",
        },
        "wrong": {
            "calls": [
                _call("list_account_transactions", account_id=1, search="Bistro"),
                _call("update_transaction_category", transaction_id=4, category="Dining"),
            ],
            "final_answer": "Recategorized the Bistro Lumiere charge to Dining.",
        },
    },
    {
        "task": "Yesterday's $120 transfer from 'Everyday Checking' that was meant for my 'Vacation Fund' went to my 'Emergency Fund' by mistake; reverse that transfer and send the $120 from 'Everyday Checking' to 'Vacation Fund' instead.",
        "task_type": "state_mutating",
        "repair": True,
        "verifier": V_FIX_WRONG_TRANSFER,
        "solution": {
            "calls": [
                _call("list_transfers", account_id=2),
                _call("reverse_transfer", transfer_id=4, reason="Sent to Emergency Fund instead of Vacation Fund"),
                _call("create_transfer", from_account_id=1, to_account_id=3, amount=120.0, memo="Vacation Fund deposit"),
            ],
            "final_answer": "Reversed the $120 transfer to the Emergency Fund and sent $120 from Everyday Checking to the Vacation Fund.",
        },
        "wrong": {
            "calls": [
                _call("list_transfers"),
                _call("create_transfer", from_account_id=1, to_account_id=3, amount=120.0, memo="Vacation Fund deposit"),
            ],
            "final_answer": "Sent $120 to the Vacation Fund.",
        },
    },
    {
        "task": "My monthly $1,450 rent payment to 'Oakridge Property Management' was accidentally scheduled twice; cancel the duplicate that was added most recently and keep the original schedule.",
        "task_type": "state_mutating",
        "repair": True,
        "verifier": V_DUPLICATE_RENT,
        "solution": {
            "calls": [
                _call("search_payees", name="Oakridge"),
                _call("list_scheduled_payments", payee_id=3),
                _call("cancel_scheduled_payment", payment_id=5),
            ],
            "final_answer": "Cancelled the duplicate rent schedule added yesterday; the original monthly $1,450 rent payment stays active.",
        },
        "wrong": {
            "calls": [
                _call("list_scheduled_payments", payee_id=3),
                _call("cancel_scheduled_payment", payment_id=1),
            ],
            "final_answer": "Cancelled the duplicate rent payment.",
        },
    },
]

PROBES = [
    _call("delete_payee", payee_id=7),
    _call("delete_payee", payee_id=1),
    _call("create_transfer", from_account_id=3, to_account_id=1, amount=5000.0, memo="too much"),
    _call("create_transfer", from_account_id=4, to_account_id=1, amount=10.0),
    _call("reverse_transfer", transfer_id=99),
    _call("create_budget", category="Groceries", monthly_limit=500.0),
    _call("update_scheduled_payment", payment_id=2, amount=64.5, next_run_date="2027-03-15"),
    _call("list_transfers", status="reversed"),
    _call("list_budgets", category="Dining"),
    _call("list_account_transactions", account_id=6),
]

# ---------------------------------------------------------------------------
# task families (awm.scenarios.families): parameterised tasks, one instance per slot row
# ---------------------------------------------------------------------------

# The hand-written tasks' helpers plus answer_text() (the final answer lower-cased, <think> blocks dropped).
_family_verifier = partial(verifier, prelude(
    '''tables = ["users", "accounts", "payees", "transfers", "transactions", "budgets", "scheduled_payments"]''',
    TABLE_BY_ID, DIFF_ROWS, UNCHANGED_BY_DIFF, SAME_MONEY, NUMBERS, MENTIONS_AMOUNT, ONLY_CHANGED, ANSWER_TEXT))

_PAYEE_SLOTS = "SELECT name, category, account_number FROM payees WHERE user_id = 1 ORDER BY id"

# the end of a budget-limit check: exactly the budgets in `limits` (id -> new limit) changed, each in its
# monthly limit only, and nothing else
_LIMITS_SET = '''
added, removed, changed = diff("budgets")
if added or removed or set(changed) != set(limits):
    return False
for key, limit in limits.items():
    before, after = changed[key]
    if not same_money(after["monthly_limit"], limit) or not only_changed(before, after, {"monthly_limit"}):
        return False
return unchanged("users", "accounts", "payees", "transfers", "transactions", "scheduled_payments")
'''

FAMILIES = [
    {
        "family": "account_balance",
        "task_type": "info_seeking",
        "slots": "SELECT name, status, balance FROM accounts WHERE user_id = 1 ORDER BY id",
        "task": "What is the current balance of my '{name}' account?",
        "verifier": _family_verifier,
        # a credit balance is negative (money owed): the answer may state it without the sign
        "check": 'return unchanged(*tables) and mentions_amount(answer_text(), abs(P["balance"]))',
        "solution": {"calls": [{"tool": "list_accounts", "arguments": {"include_closed": True}}],
                     "final_answer": "The balance of your '{name}' account ({status}) is ${balance:.2f}."},
    },
    {
        "family": "payee_customer_number",
        "task_type": "info_seeking",
        "slots": _PAYEE_SLOTS,
        "task": "What customer number do I have on file for my saved payee '{name}'?",
        "verifier": _family_verifier,
        "check": 'return unchanged(*tables) and P["account_number"].lower() in answer_text()',
        "solution": {"calls": [{"tool": "search_payees", "arguments": {"name": "{name}"}}],
                     "final_answer": "Your customer number with {name} is {account_number}."},
    },
    {
        "family": "payee_default_category",
        "task_type": "info_seeking",
        "slots": _PAYEE_SLOTS,
        "task": "Which spending category is my saved payee '{name}' assigned to by default?",
        "verifier": _family_verifier,
        "check": 'return unchanged(*tables) and P["category"].lower() in answer_text()',
        "solution": {"calls": [{"tool": "search_payees", "arguments": {"name": "{name}"}}],
                     "final_answer": "Payments to {name} are categorized as {category} by default."},
    },
    {
        "family": "budget_monthly_limit",
        "task_type": "info_seeking",
        "slots": "SELECT category, monthly_limit FROM budgets WHERE user_id = 1 ORDER BY id",
        "task": "How much is the monthly limit of my '{category}' budget?",
        "verifier": _family_verifier,
        "check": 'return unchanged(*tables) and mentions_amount(answer_text(), P["monthly_limit"])',
        "solution": {"calls": [{"tool": "list_budgets", "arguments": {"category": "{category}"}}],
                     "final_answer": "Your {category} budget has a monthly limit of ${monthly_limit:.2f}."},
    },
    {
        "family": "transfer_between_accounts",
        "task_type": "state_mutating",
        # every ordered pair of open accounts whose source can send money (not the card); the amount
        # (50 x the sum of the two ids) stays below every source balance
        "slots": "SELECT a.id AS from_id, a.name AS from_name, b.id AS to_id, b.name AS to_name, "
                 "50 * (a.id + b.id) AS amount FROM accounts a JOIN accounts b ON b.id <> a.id "
                 "WHERE a.user_id = 1 AND b.user_id = 1 AND a.status = 'open' AND b.status = 'open' "
                 "AND a.account_type <> 'credit' ORDER BY a.id, b.id",
        "task": "Transfer ${amount} from my '{from_name}' account to my '{to_name}'.",
        "verifier": _family_verifier,
        "check": '''
added, removed, changed = diff("transfers")
if removed or changed or len(added) != 1:
    return False
tr = added[0]
if (tr["user_id"] != 1 or tr["from_account_id"] != P["from_id"] or tr["to_account_id"] != P["to_id"]
        or tr["status"] != "completed" or not same_money(tr["amount"], P["amount"])):
    return False
a_added, a_removed, a_changed = diff("accounts")
if a_added or a_removed or set(a_changed) != {P["from_id"], P["to_id"]}:
    return False
for acct_id, delta in ((P["from_id"], -P["amount"]), (P["to_id"], P["amount"])):
    before, after = a_changed[acct_id]
    if not same_money(after["balance"] - before["balance"], delta) or not only_changed(before, after, {"balance"}):
        return False
t_added, t_removed, t_changed = diff("transactions")
if t_removed or t_changed or len(t_added) != 2:
    return False
legs = sorted((t["account_id"], round(t["amount"], 2)) for t in t_added if t["transfer_id"] == tr["id"])
if legs != sorted([(P["from_id"], -float(P["amount"])), (P["to_id"], float(P["amount"]))]):
    return False
return unchanged("users", "payees", "budgets", "scheduled_payments")
''',
        "solution": {"calls": [{"tool": "list_accounts", "arguments": {}},
                               {"tool": "create_transfer", "arguments": {"from_account_id": "{from_id}",
                                                                         "to_account_id": "{to_id}",
                                                                         "amount": "{amount}"}}],
                     "final_answer": "Done: ${amount} moved from {from_name} to {to_name}."},
    },
    {
        "family": "mark_charge_reimbursable",
        "task_type": "state_mutating",
        # the user's purchases and bills (not transfer legs), each named by amount, description and account
        "slots": "SELECT t.id AS txn_id, printf('%.2f', -t.amount) AS amount, t.description, a.id AS account_id, "
                 "a.name AS account FROM transactions t JOIN accounts a ON a.id = t.account_id "
                 "WHERE a.user_id = 1 AND t.amount < 0 AND t.transfer_id IS NULL ORDER BY t.id",
        "task": "My employer is paying me back for the ${amount} '{description}' charge on my '{account}'; "
                "change that transaction's category to 'Reimbursable'.",
        "verifier": _family_verifier,
        "check": '''
added, removed, changed = diff("transactions")
if added or removed or set(changed) != {P["txn_id"]}:
    return False
before, after = changed[P["txn_id"]]
if (after["category"] or "").strip().lower() != "reimbursable" or not only_changed(before, after, {"category"}):
    return False
return unchanged("users", "accounts", "payees", "transfers", "budgets", "scheduled_payments")
''',
        "solution": {"calls": [{"tool": "list_accounts", "arguments": {}},
                               {"tool": "list_account_transactions", "arguments": {"account_id": "{account_id}",
                                                                                   "search": "{description}"}},
                               {"tool": "update_transaction_category", "arguments": {"transaction_id": "{txn_id}",
                                                                                     "category": "Reimbursable"}}],
                     "final_answer": "The ${amount} '{description}' charge on {account} is now categorized as "
                                     "Reimbursable."},
    },
    {
        # two writes of the same tool in one plan: only in the recovery testbed (awm_grpo.recovery.testbed),
        # not in the practice set, whose task split and figures stay as they were
        "testbed_only": True,
        "family": "raise_two_budget_limits",
        "task_type": "state_mutating",
        "slots": "SELECT a.id AS budget_id, a.category, CAST(a.monthly_limit AS INTEGER) + 100 AS new_limit, "
                 "b.id AS budget_id2, b.category AS category2, CAST(b.monthly_limit AS INTEGER) + 25 AS new_limit2 "
                 "FROM budgets a JOIN budgets b ON b.id = (SELECT MIN(id) FROM budgets WHERE user_id = 1 AND id > a.id) "
                 "WHERE a.user_id = 1 ORDER BY a.id",
        "task": "Raise the monthly limit of my '{category}' budget to ${new_limit} and of my '{category2}' budget to "
                "${new_limit2}, keeping their alert thresholds as they are.",
        "verifier": _family_verifier,
        "check": '''
limits = {P["budget_id"]: P["new_limit"], P["budget_id2"]: P["new_limit2"]}
''' + _LIMITS_SET,
        "solution": {"calls": [{"tool": "list_budgets", "arguments": {}},
                               {"tool": "update_budget", "arguments": {"budget_id": "{budget_id}",
                                                                       "monthly_limit": "{new_limit}"}},
                               {"tool": "update_budget", "arguments": {"budget_id": "{budget_id2}",
                                                                       "monthly_limit": "{new_limit2}"}}],
                     "final_answer": "Your {category} budget's monthly limit is now ${new_limit} and your {category2} "
                                     "budget's ${new_limit2}; their alert thresholds are unchanged."},
    },
    {
        "family": "raise_budget_limit",
        "task_type": "state_mutating",
        "slots": "SELECT id AS budget_id, category, CAST(monthly_limit AS INTEGER) + 50 AS new_limit, "
                 "CAST(monthly_limit AS INTEGER) + 60 AS wrong_limit FROM budgets "
                 "WHERE user_id = 1 ORDER BY id",
        "task": "Raise the monthly limit of my '{category}' budget to ${new_limit}, keeping its alert threshold as it is.",
        "verifier": _family_verifier,
        "check": '''
limits = {P["budget_id"]: P["new_limit"]}
''' + _LIMITS_SET,
        "solution": {"calls": [{"tool": "list_budgets", "arguments": {"category": "{category}"}},
                               {"tool": "update_budget", "arguments": {"budget_id": "{budget_id}",
                                                                       "monthly_limit": "{new_limit}"}}],
                     "final_answer": "Your {category} budget's monthly limit is now ${new_limit}; its alert "
                                     "threshold is unchanged."},
        "wrong": {"calls": [{"tool": "update_budget", "arguments": {"budget_id": "{budget_id}",
                                                                    "monthly_limit": "{wrong_limit}"}}]},
    },
]
