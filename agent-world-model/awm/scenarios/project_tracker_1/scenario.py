"""project_tracker_1: a small team issue tracker (projects, issues, labels, assignments, comments)."""

from __future__ import annotations

from functools import partial

from awm.scenarios.verifier_kit import (
    ANSWER,
    NORM,
    ONE,
    ROWS,
    TABLE_SORTED,
    UNCHANGED_TABLES,
    prelude,
    verifier,
)

NAME = "project_tracker_1"

DESCRIPTION = (
    "Trackly is a lightweight issue tracker used by a small software team to plan and follow its "
    "work across several projects. Each project has a short key, an owner, a status (active or "
    "archived) and a roster of members with a role such as maintainer, developer or reporter. "
    "Members file issues inside a project; every issue has a title, an optional description, a "
    "status that moves from open through in progress to resolved or closed, a priority from low to "
    "critical, an optional due date, a reporter and at most one assignee, who must be a member of "
    "the project. Issues can be organised with coloured labels such as bug, urgent or regression; "
    "labels are defined per project, so two projects can each have their own label with the same "
    "name, and an issue may only carry labels of its own project. Team members discuss issues in "
    "comment threads and can remove their own comments. The signed-in user is a workspace admin who "
    "can browse projects and their members, search issues by project, status, assignee, label or "
    "title text, open an issue to see its labels and comment count, file new issues, edit their "
    "fields, reassign them, create labels, attach or detach labels, comment, and delete issues that "
    "were filed by mistake, which also removes their comments and label links. The environment "
    "simulates day-to-day triage: answering questions about who owns what and what is due, filing "
    "and closing work, rebalancing assignments between teammates, and cleaning up mistakes such as "
    "a label placed on the wrong issue or an issue that was accidentally filed twice."
)

TABLES = [
    {
        "name": "users",
        "ddl": (
            "CREATE TABLE users (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    username TEXT NOT NULL UNIQUE,\n"
            "    full_name TEXT NOT NULL,\n"
            "    email TEXT NOT NULL UNIQUE,\n"
            "    role TEXT NOT NULL DEFAULT 'member' CHECK (role IN ('admin', 'member', 'viewer')),\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_users_full_name ON users(full_name);"],
    },
    {
        "name": "projects",
        "ddl": (
            "CREATE TABLE projects (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    key TEXT NOT NULL UNIQUE,\n"
            "    name TEXT NOT NULL UNIQUE,\n"
            "    description TEXT,\n"
            "    owner_id INTEGER NOT NULL,\n"
            "    status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'archived')),\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    FOREIGN KEY (owner_id) REFERENCES users(id)\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_projects_status ON projects(status);"],
    },
    {
        "name": "project_members",
        "ddl": (
            "CREATE TABLE project_members (\n"
            "    project_id INTEGER NOT NULL,\n"
            "    user_id INTEGER NOT NULL,\n"
            "    role TEXT NOT NULL DEFAULT 'developer' CHECK (role IN ('maintainer', 'developer', 'reporter')),\n"
            "    joined_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    PRIMARY KEY (project_id, user_id),\n"
            "    FOREIGN KEY (project_id) REFERENCES projects(id) ON DELETE CASCADE,\n"
            "    FOREIGN KEY (user_id) REFERENCES users(id) ON DELETE CASCADE\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_project_members_user ON project_members(user_id);"],
    },
    {
        "name": "issues",
        "ddl": (
            "CREATE TABLE issues (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    project_id INTEGER NOT NULL,\n"
            "    title TEXT NOT NULL,\n"
            "    description TEXT,\n"
            "    status TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'in_progress', 'resolved', 'closed')),\n"
            "    priority TEXT NOT NULL DEFAULT 'medium' CHECK (priority IN ('low', 'medium', 'high', 'critical')),\n"
            "    reporter_id INTEGER NOT NULL,\n"
            "    assignee_id INTEGER,\n"
            "    due_date DATE,\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    updated_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    FOREIGN KEY (project_id) REFERENCES projects(id) ON DELETE CASCADE,\n"
            "    FOREIGN KEY (reporter_id) REFERENCES users(id),\n"
            "    FOREIGN KEY (assignee_id) REFERENCES users(id)\n"
            ");"
        ),
        "indexes": [
            "CREATE INDEX idx_issues_project_status ON issues(project_id, status);",
            "CREATE INDEX idx_issues_assignee ON issues(assignee_id);",
            "CREATE INDEX idx_issues_title ON issues(title);",
        ],
    },
    {
        "name": "labels",
        "ddl": (
            "CREATE TABLE labels (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    project_id INTEGER NOT NULL,\n"
            "    name TEXT NOT NULL,\n"
            "    color TEXT NOT NULL DEFAULT '#cccccc' CHECK (length(color) = 7 AND substr(color, 1, 1) = '#'),\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    UNIQUE (project_id, name),\n"
            "    FOREIGN KEY (project_id) REFERENCES projects(id) ON DELETE CASCADE\n"
            ");"
        ),
        "indexes": [],
    },
    {
        "name": "issue_labels",
        "ddl": (
            "CREATE TABLE issue_labels (\n"
            "    issue_id INTEGER NOT NULL,\n"
            "    label_id INTEGER NOT NULL,\n"
            "    added_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    PRIMARY KEY (issue_id, label_id),\n"
            "    FOREIGN KEY (issue_id) REFERENCES issues(id) ON DELETE CASCADE,\n"
            "    FOREIGN KEY (label_id) REFERENCES labels(id) ON DELETE CASCADE\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_issue_labels_label ON issue_labels(label_id);"],
    },
    {
        "name": "comments",
        "ddl": (
            "CREATE TABLE comments (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    issue_id INTEGER NOT NULL,\n"
            "    author_id INTEGER NOT NULL,\n"
            "    body TEXT NOT NULL CHECK (length(body) > 0),\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    FOREIGN KEY (issue_id) REFERENCES issues(id) ON DELETE CASCADE,\n"
            "    FOREIGN KEY (author_id) REFERENCES users(id)\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_comments_issue ON comments(issue_id, created_at);"],
    },
]


def _users() -> list[str]:
    people = [
        (1, "alex.chen", "Alex Chen", "admin", 400),
        (2, "priya.n", "Priya Natarajan", "member", 380),
        (3, "marcus.lee", "Marcus Lee", "member", 300),
        (4, "daniel.okafor", "Daniel Okafor", "member", 260),
        (5, "sofia.garcia", "Sofia Garcia", "member", 210),
        (6, "hana.kim", "Hana Kim", "member", 90),
    ]
    return [
        "INSERT INTO users (id, username, full_name, email, role, created_at) VALUES "
        f"({i}, '{u}', '{n}', '{u}@trackly.io', '{r}', datetime('now', '-{d} days'));"
        for i, u, n, r, d in people
    ]


def _members() -> list[str]:
    rows = [
        (1, 1, "maintainer", 200), (1, 2, "developer", 190), (1, 4, "developer", 180), (1, 5, "developer", 150),
        (2, 1, "maintainer", 170), (2, 3, "developer", 165), (2, 5, "developer", 120),
        (3, 2, "maintainer", 140), (3, 1, "developer", 140), (3, 4, "developer", 100), (3, 6, "developer", 60),
        (4, 1, "maintainer", 390),
    ]
    return [
        "INSERT INTO project_members (project_id, user_id, role, joined_at) VALUES "
        f"({p}, {u}, '{r}', datetime('now', '-{d} days'));"
        for p, u, r, d in rows
    ]


def _labels() -> list[str]:
    rows = [
        (1, 1, "bug", "#d73a4a"), (2, 1, "urgent", "#b60205"), (3, 1, "regression", "#fbca04"),
        (4, 1, "frontend", "#1d76db"), (5, 2, "bug", "#d73a4a"), (6, 2, "regression", "#fbca04"),
        (7, 2, "ios", "#0e8a16"), (8, 3, "bug", "#d73a4a"), (9, 3, "performance", "#5319e7"),
        (10, 3, "urgent", "#b60205"),
    ]
    return [
        "INSERT INTO labels (id, project_id, name, color, created_at) VALUES "
        f"({i}, {p}, '{n}', '{c}', datetime('now', '-{100 + i} days'));"
        for i, p, n, c in rows
    ]


def _issues() -> list[str]:
    # id, project, title, description, status, priority, reporter, assignee, due offset (days), age (days)
    rows = [
        (1, 1, "Checkout crashes on coupon apply", "Applying any coupon at checkout throws a 500 error.",
         "open", "critical", 5, 2, 2, 6),
        (2, 1, "Search returns stale results", "Product search shows items that were removed hours ago.",
         "open", "high", 1, 4, 5, 10),
        (3, 1, "Product images load slowly", "Category pages take several seconds to render images.",
         "in_progress", "medium", 2, 4, None, 12),
        (4, 1, "Broken link in footer", "The careers link in the footer returns 404.",
         "open", "low", 5, 4, None, 3),
        (5, 1, "Cart badge count off by one", "The cart icon shows one item too many after removal.",
         "closed", "medium", 2, 4, None, 30),
        (6, 1, "Update privacy policy page", "Legal sent a new privacy policy text to publish.",
         "open", "low", 1, 5, 14, 2),
        (7, 2, "Push notifications arrive twice", "Every push notification is delivered two times on iOS.",
         "open", "high", 3, 3, None, 4),
        (8, 2, "Push notifications delayed on Android", "Notifications arrive up to ten minutes late.",
         "open", "medium", 5, 5, None, 8),
        (9, 2, "App freezes on login screen", "The spinner never stops after entering credentials.",
         "in_progress", "critical", 1, 3, 1, 9),
        (10, 2, "Profile photo upload fails", "Uploading a HEIC photo fails silently.",
         "closed", "medium", 3, 5, None, 20),
        (11, 3, "Nightly export job times out", "The nightly warehouse export exceeds its 30 minute limit.",
         "open", "high", 2, 6, 6, 7),
        (12, 3, "Crash when uploading large CSV", "The importer runs out of memory on files above 200 MB.",
         "in_progress", "high", 4, 2, 1, 5),
        (13, 3, "Schema drift in orders table", "Two columns were renamed upstream without notice.",
         "open", "medium", 6, 4, 2, 6),
        (14, 3, "Nightly export job times out", "The nightly warehouse export exceeds its 30 minute limit.",
         "open", "high", 2, 6, 6, 1),
        (15, 3, "Deduplicate customer records", "Merge customers that share an email address.",
         "open", "low", 1, None, 10, 15),
        (16, 3, "Backfill March metrics", "Recompute the March dashboard metrics after the outage.",
         "closed", "medium", 2, 2, -2, 25),
        (17, 2, "Crash on iPad rotation", "Rotating an iPad on the cart screen crashes the app.",
         "open", "high", 5, None, None, 1),
    ]
    out = []
    for i, p, title, desc, status, prio, rep, asg, due, age in rows:
        asg_sql = "NULL" if asg is None else str(asg)
        due_sql = "NULL" if due is None else f"date('now', '{due:+d} days')"
        out.append(
            "INSERT INTO issues (id, project_id, title, description, status, priority, reporter_id, assignee_id, "
            "due_date, created_at, updated_at) VALUES "
            f"({i}, {p}, '{title}', '{desc}', '{status}', '{prio}', {rep}, {asg_sql}, {due_sql}, "
            f"datetime('now', '-{age} days'), datetime('now', '-{max(age - 1, 0)} days', '-3 hours'));"
        )
    return out


def _issue_labels() -> list[str]:
    rows = [(1, 1), (2, 1), (2, 2), (3, 4), (7, 5), (8, 5), (9, 5), (9, 6), (10, 5), (17, 5), (17, 7),
            (11, 8), (11, 9)]
    return [
        "INSERT INTO issue_labels (issue_id, label_id, added_at) VALUES "
        f"({i}, {lb}, datetime('now', '-{1 + (i % 5)} days'));"
        for i, lb in rows
    ]


def _comments() -> list[str]:
    rows = [
        (1, 1, 5, "Reproduced with code SAVE10 on Chrome and Firefox.", 5),
        (2, 1, 2, "Stack trace points to the discount rounding helper.", 4),
        (3, 11, 6, "Timeout happens after 30 minutes on the orders export.", 6),
        (4, 11, 2, "Raising the batch size did not help.", 5),
        (5, 12, 4, "Files above 200 MB fail consistently.", 4),
        (6, 7, 3, "Looks related to the token refresh change.", 3),
        (7, 2, 1, "The cache TTL might be too long.", 2),
    ]
    return [
        "INSERT INTO comments (id, issue_id, author_id, body, created_at) VALUES "
        f"({i}, {iss}, {a}, '{b}', datetime('now', '-{d} days'));"
        for i, iss, a, b, d in rows
    ]


SAMPLE = [
    {
        "table_name": "users",
        "reasoning": "The signed-in admin (id 1) first, then five teammates referenced by name in the tasks "
                     "(assignees, reporters, the people issues are moved between).",
        "insert_statements": _users(),
    },
    {
        "table_name": "projects",
        "reasoning": "Three active projects the tasks name (Web Storefront, Mobile App, Data Pipeline) and one "
                     "archived project for the status filter.",
        "insert_statements": [
            "INSERT INTO projects (id, key, name, description, owner_id, status, created_at) VALUES "
            "(1, 'WEB', 'Web Storefront', 'Customer-facing online store.', 1, 'active', datetime('now', '-200 days'));",
            "INSERT INTO projects (id, key, name, description, owner_id, status, created_at) VALUES "
            "(2, 'MOB', 'Mobile App', 'iOS and Android shopping app.', 1, 'active', datetime('now', '-170 days'));",
            "INSERT INTO projects (id, key, name, description, owner_id, status, created_at) VALUES "
            "(3, 'DATA', 'Data Pipeline', 'Nightly ETL jobs and the analytics warehouse.', 2, 'active', "
            "datetime('now', '-140 days'));",
            "INSERT INTO projects (id, key, name, description, owner_id, status, created_at) VALUES "
            "(4, 'LEG', 'Legacy Billing', 'Old billing system kept for reference.', 1, 'archived', "
            "datetime('now', '-390 days'));",
        ],
    },
    {
        "table_name": "project_members",
        "reasoning": "Rosters so that assignment rules can be checked: Sofia is on Web Storefront and Mobile App, "
                     "Marcus on Mobile App, Daniel on Web Storefront and Data Pipeline.",
        "insert_statements": _members(),
    },
    {
        "table_name": "labels",
        "reasoning": "Per-project labels with repeated names (bug, urgent, regression) so that the label of the "
                     "right project has to be picked.",
        "insert_statements": _labels(),
    },
    {
        "table_name": "issues",
        "reasoning": "Issues with mixed statuses, priorities, due dates and assignees; near-duplicate titles "
                     "(two push notification issues) and one issue filed twice in Data Pipeline (id 14).",
        "insert_statements": _issues(),
    },
    {
        "table_name": "issue_labels",
        "reasoning": "Label links, including the urgent label wrongly placed on 'Search returns stale results' "
                     "and five Mobile App bug issues, one of them closed.",
        "insert_statements": _issue_labels(),
    },
    {
        "table_name": "comments",
        "reasoning": "Discussion on several issues; the original nightly export issue has comments while its "
                     "duplicate has none; comment 7 belongs to the signed-in user.",
        "insert_statements": _comments(),
    },
]

# Helpers of this tracker's verifiers, beside the kit's.
_TRACKER_SETUP = (f"all_tables = {[t['name'] for t in TABLES]!r}\n"
                  'issue_cols = "id, project_id, title, description, status, priority, reporter_id, assignee_id, '
                  'due_date, created_at"')

_TRACKER_HELPERS = '''
def issues(path):
    # every issue column except updated_at, keyed by id
    return {r[0]: r for r in rows(path, f"SELECT {issue_cols} FROM issues")}

def links(path):
    return set(rows(path, "SELECT issue_id, label_id FROM issue_labels"))

def project_id(name):
    return one(initial_db_path, "SELECT id FROM projects WHERE name = ?", (name,))

def issue_id(project, title):
    return one(initial_db_path, "SELECT id FROM issues WHERE project_id = ? AND title = ?", (project, title))

def label_id(project, name):
    return one(initial_db_path, "SELECT id FROM labels WHERE project_id = ? AND name = ?", (project, name))

def user_id(full_name):
    return one(initial_db_path, "SELECT id FROM users WHERE full_name = ?", (full_name,))
'''

# A verifier: the kit's row helpers and this tracker's, then one task's check(), which returns the verdict.
_verifier = partial(verifier, prelude(
    _TRACKER_SETUP, ROWS, ONE, TABLE_SORTED, UNCHANGED_TABLES, _TRACKER_HELPERS, ANSWER, NORM,
    imports=("json", "re", "sqlite3")), check_returns_verdict=True)


def _call(tool: str, **arguments) -> dict:
    return {"tool": tool, "arguments": arguments}


TASKS = [
    {
        "task": "Who is assigned to the issue 'Checkout crashes on coupon apply' in the 'Web Storefront' project? "
                "Answer with the person's full name.",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": _verifier('''
            pid = project_id("Web Storefront")
            iid = issue_id(pid, "Checkout crashes on coupon apply")
            if iid is None:
                return {"result": "others"}
            assignee = one(initial_db_path,
                           "SELECT u.full_name FROM issues i JOIN users u ON u.id = i.assignee_id WHERE i.id = ?",
                           (iid,))
            reporter = one(initial_db_path,
                           "SELECT u.full_name FROM issues i JOIN users u ON u.id = i.reporter_id WHERE i.id = ?",
                           (iid,))
            if not assignee or not unchanged(*all_tables):
                return {"result": "others"}
            text = answer()
            if assignee.lower() not in text:
                return {"result": "others"}
            if reporter and reporter.lower() != assignee.lower() and reporter.lower() in text:
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("search_issues", query="Checkout crashes on coupon apply"),
                _call("get_issue", issue_id=1),
            ],
            "final_answer": "The issue 'Checkout crashes on coupon apply' is assigned to Priya Natarajan.",
        },
        "wrong": {
            "calls": [
                _call("search_issues", query="Checkout crashes on coupon apply"),
                _call("get_issue", issue_id=1),
            ],
            "final_answer": "It is handled by Sofia Garcia.",
        },
    },
    {
        "task": "How many issues in the 'Mobile App' project carry the 'bug' label and are not closed?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": _verifier('''
            pid = project_id("Mobile App")
            lid = label_id(pid, "bug")
            if pid is None or lid is None:
                return {"result": "others"}
            statuses = [r[0] for r in rows(
                initial_db_path,
                "SELECT i.status FROM issues i JOIN issue_labels il ON il.issue_id = i.id "
                "WHERE i.project_id = ? AND il.label_id = ?", (pid, lid))]
            expected = sum(1 for s in statuses if s != "closed")
            total = len(statuses)
            if not unchanged(*all_tables):
                return {"result": "others"}
            words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
            text = answer()

            def mentions(n):
                if re.search(rf"(?<![\\d.]){n}(?![\\d]|\\.\\d)", text):
                    return True
                return n < len(words) and re.search(rf"\\b{words[n]}\\b", text) is not None

            if not mentions(expected):
                return {"result": "others"}
            if total != expected and mentions(total):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("list_projects"),
                _call("list_project_labels", project_id=2),
                _call("search_issues", project_id=2, label="bug"),
            ],
            "final_answer": "4",
        },
        "wrong": {
            "calls": [
                _call("list_projects"),
                _call("search_issues", project_id=2, label="bug"),
            ],
            "final_answer": "There are 5 bug issues in the Mobile App project.",
        },
    },
    {
        "task": "Among the issues with status 'open' in the 'Data Pipeline' project, which one has the earliest "
                "due date? Give its title.",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": _verifier('''
            pid = project_id("Data Pipeline")
            if pid is None:
                return {"result": "others"}
            cands = rows(initial_db_path,
                         "SELECT title, due_date FROM issues WHERE project_id = ? AND status = 'open' "
                         "AND due_date IS NOT NULL ORDER BY due_date, id", (pid,))
            if not cands:
                return {"result": "others"}
            best_title, best_due = cands[0]
            if any(d == best_due and t != best_title for t, d in cands[1:]):
                return {"result": "others"}
            if not unchanged(*all_tables):
                return {"result": "others"}
            text = answer()
            if best_title.lower() not in text:
                return {"result": "others"}
            other_titles = {r[0] for r in rows(initial_db_path, "SELECT title FROM issues WHERE project_id = ?",
                                               (pid,))} - {best_title}
            if any(t.lower() in text for t in other_titles):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("list_projects", status="active"),
                _call("search_issues", project_id=3, status="open"),
            ],
            "final_answer": "Schema drift in orders table",
        },
        "wrong": {
            "calls": [
                _call("list_projects", status="active"),
                _call("search_issues", project_id=3),
            ],
            "final_answer": "Crash when uploading large CSV",
        },
    },
    {
        "task": "Create an issue titled 'Add dark mode toggle' in the 'Mobile App' project with priority 'medium' "
                "and assign it to Marcus Lee.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
            pid = project_id("Mobile App")
            marcus = user_id("Marcus Lee")
            if pid is None or marcus is None:
                return {"result": "others"}
            before, after = issues(initial_db_path), issues(final_db_path)
            if any(after.get(k) != v for k, v in before.items()):
                return {"result": "others"}
            new = [after[k] for k in after if k not in before]
            if len(new) != 1:
                return {"result": "others"}
            _, project, title, _, status, priority, reporter, assignee, _, _ = new[0]
            if project != pid or norm(title) != "add dark mode toggle":
                return {"result": "others"}
            if status != "open" or priority != "medium" or assignee != marcus or reporter != 1:
                return {"result": "others"}
            if not unchanged("users", "projects", "project_members", "labels", "issue_labels", "comments"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("list_projects"),
                _call("search_users", query="Marcus"),
                _call("create_issue", project_id=2, title="Add dark mode toggle", priority="medium", assignee_id=3),
            ],
            "final_answer": "Created 'Add dark mode toggle' in Mobile App (medium priority), assigned to Marcus Lee.",
        },
        "wrong": {
            "calls": [
                _call("list_projects"),
                _call("create_issue", project_id=2, title="Add dark mode toggle", priority="medium"),
            ],
            "final_answer": "Created the issue 'Add dark mode toggle'.",
        },
    },
    {
        "task": "Add the 'regression' label to the issue 'Push notifications arrive twice' in the 'Mobile App' project.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
            pid = project_id("Mobile App")
            iid = issue_id(pid, "Push notifications arrive twice")
            lid = label_id(pid, "regression")
            if iid is None or lid is None:
                return {"result": "others"}
            before, after = links(initial_db_path), links(final_db_path)
            if (iid, lid) in before or after - before != {(iid, lid)} or before - after:
                return {"result": "others"}
            if issues(initial_db_path) != issues(final_db_path):
                return {"result": "others"}
            if not unchanged("users", "projects", "project_members", "labels", "comments"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("search_issues", project_id=2, query="Push notifications arrive twice"),
                _call("list_project_labels", project_id=2),
                _call("add_label_to_issue", issue_id=7, label_id=6),
            ],
            "final_answer": "Added the 'regression' label to 'Push notifications arrive twice'.",
        },
        "wrong": {
            "calls": [
                _call("search_issues", project_id=2, query="Push notifications"),
                _call("list_project_labels", project_id=2),
                _call("add_label_to_issue", issue_id=8, label_id=6),
            ],
            "final_answer": "Added the 'regression' label.",
        },
    },
    {
        "task": "Close the issue 'Crash when uploading large CSV' in the 'Data Pipeline' project and add the comment "
                "'Fixed by streaming parser in v2.3' to it.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
            pid = project_id("Data Pipeline")
            iid = issue_id(pid, "Crash when uploading large CSV")
            if iid is None:
                return {"result": "others"}
            before, after = issues(initial_db_path), issues(final_db_path)
            if set(before) != set(after):
                return {"result": "others"}
            for k, row in before.items():
                if k == iid:
                    expected = row[:4] + ("closed",) + row[5:]
                    if after[k] != expected:
                        return {"result": "others"}
                elif after[k] != row:
                    return {"result": "others"}
            old = {r[0]: r for r in rows(initial_db_path, "SELECT id, issue_id, author_id, body FROM comments")}
            new = {r[0]: r for r in rows(final_db_path, "SELECT id, issue_id, author_id, body FROM comments")}
            if any(new.get(k) != v for k, v in old.items()):
                return {"result": "others"}
            added = [new[k] for k in new if k not in old]
            if len(added) != 1:
                return {"result": "others"}
            _, c_issue, c_author, c_body = added[0]
            if c_issue != iid or c_author != 1 or norm(c_body) != "fixed by streaming parser in v2.3":
                return {"result": "others"}
            if not unchanged("users", "projects", "project_members", "labels", "issue_labels"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("search_issues", project_id=3, query="large CSV"),
                _call("update_issue", issue_id=12, status="closed"),
                _call("add_comment", issue_id=12, body="Fixed by streaming parser in v2.3"),
            ],
            "final_answer": "Closed 'Crash when uploading large CSV' and added the comment.",
        },
        "wrong": {
            "calls": [
                _call("search_issues", project_id=3, query="large CSV"),
                _call("update_issue", issue_id=12, status="resolved"),
                _call("add_comment", issue_id=12, body="Fixed by streaming parser in v2.3"),
            ],
            "final_answer": "Marked the CSV crash as resolved and commented.",
        },
    },
    {
        "task": "Reassign every issue with status 'open' that Daniel Okafor has in the 'Web Storefront' project to "
                "Sofia Garcia.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
            pid = project_id("Web Storefront")
            daniel, sofia = user_id("Daniel Okafor"), user_id("Sofia Garcia")
            if pid is None or daniel is None or sofia is None:
                return {"result": "others"}
            before, after = issues(initial_db_path), issues(final_db_path)
            targets = {k for k, r in before.items() if r[1] == pid and r[4] == "open" and r[7] == daniel}
            if not targets or set(before) != set(after):
                return {"result": "others"}
            for k, row in before.items():
                expected = row[:7] + (sofia,) + row[8:] if k in targets else row
                if after[k] != expected:
                    return {"result": "others"}
            if not unchanged("users", "projects", "project_members", "labels", "issue_labels", "comments"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("search_users", query="Daniel"),
                _call("search_users", query="Sofia"),
                _call("search_issues", project_id=1, assignee_id=4, status="open"),
                _call("assign_issue", issue_id=2, assignee_id=5),
                _call("assign_issue", issue_id=4, assignee_id=5),
            ],
            "final_answer": "Reassigned 'Search returns stale results' and 'Broken link in footer' to Sofia Garcia.",
        },
        "wrong": {
            "calls": [
                _call("search_users", query="Daniel"),
                _call("search_issues", project_id=1, assignee_id=4),
                _call("assign_issue", issue_id=2, assignee_id=5),
                _call("assign_issue", issue_id=3, assignee_id=5),
                _call("assign_issue", issue_id=4, assignee_id=5),
            ],
            "final_answer": "Moved Daniel's Web Storefront issues to Sofia.",
        },
    },
    {
        "task": "Create a label named 'needs-design' with color '#a855f7' in the 'Web Storefront' project and apply it "
                "to the issue 'Product images load slowly'.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
            pid = project_id("Web Storefront")
            iid = issue_id(pid, "Product images load slowly")
            if iid is None:
                return {"result": "others"}
            old = {r[0]: r for r in rows(initial_db_path, "SELECT id, project_id, name, color FROM labels")}
            new = {r[0]: r for r in rows(final_db_path, "SELECT id, project_id, name, color FROM labels")}
            if any(new.get(k) != v for k, v in old.items()):
                return {"result": "others"}
            added = [new[k] for k in new if k not in old]
            if len(added) != 1:
                return {"result": "others"}
            lid, l_project, l_name, l_color = added[0]
            if l_project != pid or norm(l_name) != "needs-design" or str(l_color).lower() != "#a855f7":
                return {"result": "others"}
            before, after = links(initial_db_path), links(final_db_path)
            if after - before != {(iid, lid)} or before - after:
                return {"result": "others"}
            if issues(initial_db_path) != issues(final_db_path):
                return {"result": "others"}
            if not unchanged("users", "projects", "project_members", "comments"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("list_project_labels", project_id=1),
                _call("create_label", project_id=1, name="needs-design", color="#a855f7"),
                _call("search_issues", project_id=1, query="Product images"),
                _call("add_label_to_issue", issue_id=3, label_id=11),
            ],
            "final_answer": "Created 'needs-design' in Web Storefront and applied it to 'Product images load slowly'.",
        },
        "wrong": {
            "calls": [
                _call("create_label", project_id=1, name="needs-design", color="#a855f7"),
            ],
            "final_answer": "Created the 'needs-design' label.",
        },
    },
    {
        "task": "In the 'Web Storefront' project the 'urgent' label was put on 'Search returns stale results' by "
                "mistake instead of on 'Checkout crashes on coupon apply'; move it to the correct issue.",
        "task_type": "state_mutating",
        "repair": True,
        "verifier": _verifier('''
            pid = project_id("Web Storefront")
            lid = label_id(pid, "urgent")
            wrong_issue = issue_id(pid, "Search returns stale results")
            right_issue = issue_id(pid, "Checkout crashes on coupon apply")
            if None in (lid, wrong_issue, right_issue):
                return {"result": "others"}
            before, after = links(initial_db_path), links(final_db_path)
            if (wrong_issue, lid) not in before or (right_issue, lid) in before:
                return {"result": "others"}
            if after != (before - {(wrong_issue, lid)}) | {(right_issue, lid)}:
                return {"result": "others"}
            if issues(initial_db_path) != issues(final_db_path):
                return {"result": "others"}
            if not unchanged("users", "projects", "project_members", "labels", "comments"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("search_issues", project_id=1, label="urgent"),
                _call("list_project_labels", project_id=1),
                _call("remove_label_from_issue", issue_id=2, label_id=2),
                _call("add_label_to_issue", issue_id=1, label_id=2),
            ],
            "final_answer": "Moved the 'urgent' label from 'Search returns stale results' to "
                            "'Checkout crashes on coupon apply'.",
        },
        "wrong": {
            "calls": [
                _call("list_project_labels", project_id=1),
                _call("add_label_to_issue", issue_id=1, label_id=2),
            ],
            "final_answer": "Added 'urgent' to 'Checkout crashes on coupon apply'.",
        },
    },
    {
        "task": "The issue 'Nightly export job times out' was accidentally filed twice in the 'Data Pipeline' "
                "project; delete the newer copy, which has no comments, and keep the original.",
        "task_type": "state_mutating",
        "repair": True,
        "verifier": _verifier('''
            pid = project_id("Data Pipeline")
            if pid is None:
                return {"result": "others"}
            copies = rows(initial_db_path,
                          "SELECT i.id, i.created_at, (SELECT COUNT(*) FROM comments c WHERE c.issue_id = i.id) "
                          "FROM issues i WHERE i.project_id = ? AND i.title = ? ORDER BY i.created_at, i.id",
                          (pid, "Nightly export job times out"))
            if len(copies) != 2:
                return {"result": "others"}
            without = [c for c in copies if c[2] == 0]
            if len(without) != 1 or without[0][0] != copies[-1][0]:
                return {"result": "others"}
            target = without[0][0]
            before, after = issues(initial_db_path), issues(final_db_path)
            expected = {k: v for k, v in before.items() if k != target}
            if after != expected:
                return {"result": "others"}
            if links(final_db_path) != {lk for lk in links(initial_db_path) if lk[0] != target}:
                return {"result": "others"}
            if not unchanged("users", "projects", "project_members", "labels", "comments"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("search_issues", project_id=3, query="Nightly export"),
                _call("list_issue_comments", issue_id=11),
                _call("list_issue_comments", issue_id=14),
                _call("delete_issue", issue_id=14),
            ],
            "final_answer": "Deleted the duplicate issue #14 and kept the original #11 with its comments.",
        },
        "wrong": {
            "calls": [
                _call("search_issues", project_id=3, query="Nightly export"),
                _call("delete_issue", issue_id=11),
            ],
            "final_answer": "Deleted the duplicate nightly export issue.",
        },
    },
]

PROBES = [
    _call("get_project", project_id=2),
    _call("get_project", project_id=99),
    _call("list_projects", status="archived"),
    _call("create_label", project_id=2, name="bug", color="#d73a4a"),
    _call("add_label_to_issue", issue_id=7, label_id=1),
    _call("assign_issue", issue_id=7, assignee_id=4),
    _call("create_issue", project_id=4, title="Reopen legacy invoices"),
    _call("update_issue", issue_id=15, priority="high", due_date="2030-01-15"),
    _call("delete_comment", comment_id=1),
    _call("delete_comment", comment_id=7),
    _call("list_issue_comments", issue_id=1),
]

# Task families (awm.scenarios.families): the practice set's parameterised tasks, one instance per slot row.
# Issues are named by title and project; the one title filed twice ('Nightly export job times out') is left out
# so that every title names exactly one issue.
_ISSUE_SLOTS = (
    "SELECT i.id AS issue_id, i.title, p.id AS project_id, p.name AS project, i.status, "
    "REPLACE(i.status, '_', ' ') AS status_text, i.priority, i.assignee_id, a.full_name AS assignee, "
    "r.full_name AS reporter FROM issues i JOIN projects p ON p.id = i.project_id "
    "JOIN users r ON r.id = i.reporter_id LEFT JOIN users a ON a.id = i.assignee_id "
    "WHERE (SELECT COUNT(*) FROM issues d WHERE d.title = i.title) = 1"
)

# A check's opening: the final answer without the issue's own title (so its words never count as a value).
_ANSWER_WITHOUT_TITLE = 'text = answer().replace(P["title"].lower(), " ")\n'

# A person question's check: the DB untouched and the answer naming that person and no other user.
_ONE_PERSON = '''
def _one_person(expected):
    if not unchanged(*all_tables):
        return {"result": "others"}
    text = answer()
    names = {r[0].lower() for r in rows(initial_db_path, "SELECT full_name FROM users")}
    if expected.lower() not in text or any(n in text for n in names - {expected.lower()}):
        return {"result": "others"}
    return {"result": "complete"}
'''

# A state-mutating check's ending: every table but issues and issue_labels is as it was.
_OTHERS_UNCHANGED = '''
if not unchanged("users", "projects", "project_members", "labels", "comments"):
    return {"result": "others"}
return {"result": "complete"}
'''
# the end of a priority check: issues in `new` (id -> priority) changed to it, every other issue and link unchanged
_PRIORITIES_SET = '''
for k, row in before.items():
    expected = row[:5] + (new[k],) + row[6:] if k in new else row
    if after[k] != expected:
        return {"result": "others"}
if links(initial_db_path) != links(final_db_path):
    return {"result": "others"}
''' + _OTHERS_UNCHANGED

FAMILIES = [
    {
        "family": "issue_priority",
        "task_type": "info_seeking",
        "slots": _ISSUE_SLOTS + " ORDER BY i.id",
        "limit": 9,
        "task": "What priority does the issue '{title}' in the '{project}' project have?",
        "verifier": _verifier,
        "check": _ANSWER_WITHOUT_TITLE + '''
if not unchanged(*all_tables):
    return {"result": "others"}
if not re.search(rf"\\b{P['priority']}\\b", text):
    return {"result": "others"}
others = {"low", "medium", "high", "critical"} - {P["priority"]}
if any(re.search(rf"\\b{w}\\b", text) for w in others):
    return {"result": "others"}
return {"result": "complete"}
''',
        "solution": {"calls": [{"tool": "search_issues", "arguments": {"query": "{title}"}}],
                     "final_answer": "The issue '{title}' has {priority} priority."},
    },
    {
        "family": "issue_status",
        "task_type": "info_seeking",
        "slots": _ISSUE_SLOTS + " ORDER BY i.id DESC",
        "limit": 9,
        "task": "What is the current status of '{title}' in the '{project}' project?",
        "verifier": _verifier,
        "check": _ANSWER_WITHOUT_TITLE + '''
if not unchanged(*all_tables):
    return {"result": "others"}
text = re.sub(r"in[ _-]progress", "in_progress", text)
words = {"open", "in_progress", "resolved", "closed"}
if not re.search(rf"\\b{P['status']}\\b", text):
    return {"result": "others"}
if any(re.search(rf"\\b{w}\\b", text) for w in words - {P["status"]}):
    return {"result": "others"}
return {"result": "complete"}
''',
        "solution": {"calls": [{"tool": "search_issues", "arguments": {"query": "{title}"}}],
                     "final_answer": "'{title}' is currently {status_text}."},
    },
    {
        "family": "issue_assignee",
        "task_type": "info_seeking",
        # issue 1 is the hand-written assignee question
        "slots": _ISSUE_SLOTS + " AND i.assignee_id IS NOT NULL AND i.id <> 1 ORDER BY i.id DESC",
        "limit": 8,
        "task": "Which team member is '{title}' in the '{project}' project assigned to? Give their full name.",
        "verifier": _verifier,
        "check": _ONE_PERSON + 'return _one_person(P["assignee"])\n',
        "solution": {"calls": [{"tool": "search_issues", "arguments": {"query": "{title}"}},
                               {"tool": "get_issue", "arguments": {"issue_id": "{issue_id}"}}],
                     "final_answer": "'{title}' is assigned to {assignee}."},
    },
    {
        "family": "issue_reporter",
        "task_type": "info_seeking",
        "slots": _ISSUE_SLOTS + " ORDER BY i.id",
        "limit": 8,
        "task": "Who reported the issue '{title}' in the '{project}' project? Answer with the person's full name.",
        "verifier": _verifier,
        "check": _ONE_PERSON + 'return _one_person(P["reporter"])\n',
        "solution": {"calls": [{"tool": "search_issues", "arguments": {"query": "{title}"}},
                               {"tool": "get_issue", "arguments": {"issue_id": "{issue_id}"}}],
                     "final_answer": "'{title}' was reported by {reporter}."},
    },
    {
        "family": "set_priority",
        "task_type": "state_mutating",
        # open or in-progress issues with odd ids (a spread over the projects), each moved one priority step
        # (critical ones down to high)
        "slots": "SELECT s.*, CASE s.priority WHEN 'low' THEN 'medium' WHEN 'medium' THEN 'high' "
                 "WHEN 'high' THEN 'critical' ELSE 'high' END AS new_priority, CASE s.priority WHEN 'low' THEN 'high' "
                 "WHEN 'medium' THEN 'critical' ELSE 'medium' END AS wrong_priority FROM (" + _ISSUE_SLOTS +
                 " AND i.status IN ('open', 'in_progress') AND i.id % 2 = 1) s ORDER BY s.issue_id",
        "limit": 6,
        "task": "Set the priority of the issue '{title}' in the '{project}' project to {new_priority}.",
        "verifier": _verifier,
        "check": '''
before, after = issues(initial_db_path), issues(final_db_path)
if set(before) != set(after) or before[P["issue_id"]][5] != P["priority"]:
    return {"result": "others"}
new = {P["issue_id"]: P["new_priority"]}
''' + _PRIORITIES_SET,
        "solution": {"calls": [{"tool": "search_issues", "arguments": {"query": "{title}"}},
                               {"tool": "update_issue", "arguments": {"issue_id": "{issue_id}",
                                                                      "priority": "{new_priority}"}}],
                     "final_answer": "The priority of '{title}' is now {new_priority}."},
        "wrong": {"calls": [{"tool": "update_issue", "arguments": {"issue_id": "{issue_id}",
                                                                   "priority": "{wrong_priority}"}}]},
    },
    {
        # two writes of the same tool in one plan: only in the recovery testbed (awm_grpo.recovery.testbed),
        # not in the practice set, whose task split and figures stay as they were
        "testbed_only": True,
        "family": "set_two_priorities",
        "task_type": "state_mutating",
        "slots": "SELECT a.issue_id, a.title, a.project, a.priority, 'high' AS new_priority, b.issue_id AS issue_id2, "
                 "b.title AS title2, b.priority AS priority2, 'low' AS new_priority2 FROM (" + _ISSUE_SLOTS +
                 " AND i.status IN ('open', 'in_progress') AND i.priority <> 'high') a JOIN (" + _ISSUE_SLOTS +
                 " AND i.status IN ('open', 'in_progress') AND i.priority <> 'low') b ON b.project_id = a.project_id "
                 "AND b.issue_id = (SELECT MIN(x.id) FROM issues x WHERE x.project_id = a.project_id AND x.id > a.issue_id "
                 "AND x.status IN ('open', 'in_progress') AND x.priority <> 'low') ORDER BY a.issue_id",
        "limit": 6,
        "task": "In the '{project}' project, set the priority of '{title}' to {new_priority} and of '{title2}' to "
                "{new_priority2}.",
        "verifier": _verifier,
        "check": '''
before, after = issues(initial_db_path), issues(final_db_path)
if set(before) != set(after):
    return {"result": "others"}
new = {P["issue_id"]: P["new_priority"], P["issue_id2"]: P["new_priority2"]}
''' + _PRIORITIES_SET,
        "solution": {"calls": [{"tool": "search_issues", "arguments": {"query": "{title}"}},
                               {"tool": "update_issue", "arguments": {"issue_id": "{issue_id}",
                                                                      "priority": "{new_priority}"}},
                               {"tool": "search_issues", "arguments": {"query": "{title2}"}},
                               {"tool": "update_issue", "arguments": {"issue_id": "{issue_id2}",
                                                                      "priority": "{new_priority2}"}}],
                     "final_answer": "'{title}' is now {new_priority} and '{title2}' {new_priority2}."},
    },
    {
        "family": "reassign_issue",
        "task_type": "state_mutating",
        # open or in-progress issues, each handed to the teammate (not the signed-in user 1) with the lowest
        # user id among the project's members who does not hold it yet
        "slots": "SELECT s.*, u.id AS user_id, u.full_name AS person FROM (" + _ISSUE_SLOTS +
                 " AND i.status IN ('open', 'in_progress')) s JOIN users u ON u.id = (SELECT MIN(m.user_id) "
                 "FROM project_members m WHERE m.project_id = s.project_id AND m.user_id <> 1 "
                 "AND m.user_id <> COALESCE(s.assignee_id, 0)) ORDER BY s.issue_id DESC",
        "limit": 6,
        "task": "Make {person} the assignee of the issue '{title}' in the '{project}' project.",
        "verifier": _verifier,
        "check": '''
before, after = issues(initial_db_path), issues(final_db_path)
if set(before) != set(after) or before[P["issue_id"]][7] == P["user_id"]:
    return {"result": "others"}
for k, row in before.items():
    expected = row[:7] + (P["user_id"],) + row[8:] if k == P["issue_id"] else row
    if after[k] != expected:
        return {"result": "others"}
if links(initial_db_path) != links(final_db_path):
    return {"result": "others"}
''' + _OTHERS_UNCHANGED,
        "solution": {"calls": [{"tool": "search_issues", "arguments": {"query": "{title}"}},
                               {"tool": "get_project", "arguments": {"project_id": "{project_id}"}},
                               {"tool": "assign_issue", "arguments": {"issue_id": "{issue_id}",
                                                                      "assignee_id": "{user_id}"}}],
                     "final_answer": "'{title}' is now assigned to {person}."},
    },
    {
        "family": "add_label",
        "task_type": "state_mutating",
        # open or in-progress issues, each with the newest label of its project it does not carry yet (no 'ios'
        # label on an Android issue), taken round-robin over the projects
        "slots": "SELECT s.*, l.id AS label_id, l.name AS label FROM (" + _ISSUE_SLOTS +
                 " AND i.status IN ('open', 'in_progress')) s JOIN labels l ON l.id = (SELECT MAX(x.id) "
                 "FROM labels x WHERE x.project_id = s.project_id AND NOT EXISTS (SELECT 1 FROM issue_labels il "
                 "WHERE il.issue_id = s.issue_id AND il.label_id = x.id)) "
                 "WHERE NOT (l.name = 'ios' AND s.title LIKE '%Android%') "
                 "ORDER BY ROW_NUMBER() OVER (PARTITION BY s.project_id ORDER BY s.issue_id), s.project_id",
        "limit": 7,
        "task": "Put the '{label}' label on the issue '{title}' in the '{project}' project.",
        "verifier": _verifier,
        "check": '''
before, after = links(initial_db_path), links(final_db_path)
pair = (P["issue_id"], P["label_id"])
if pair in before or after != before | {pair}:
    return {"result": "others"}
if issues(initial_db_path) != issues(final_db_path):
    return {"result": "others"}
''' + _OTHERS_UNCHANGED,
        "solution": {"calls": [{"tool": "search_issues", "arguments": {"query": "{title}"}},
                               {"tool": "list_project_labels", "arguments": {"project_id": "{project_id}"}},
                               {"tool": "add_label_to_issue", "arguments": {"issue_id": "{issue_id}",
                                                                            "label_id": "{label_id}"}}],
                     "final_answer": "Added the '{label}' label to '{title}'."},
    },
]
