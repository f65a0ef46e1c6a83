"""clinic_appointments_1: a clinic's patient portal (appointments, prescriptions, refills, messages)."""

from functools import partial

from awm.scenarios.verifier_kit import ID_DIFF_PRELUDE, verifier

NAME = "clinic_appointments_1"

DESCRIPTION = (
    "Lakeside Family Clinic is a multi-specialty outpatient clinic whose patient portal lets a logged-in "
    "patient manage their care without calling the front desk. The clinic employs doctors in internal "
    "medicine, pediatrics, dermatology, orthopedics and cardiology; each doctor publishes a calendar of "
    "30-minute time slots that are either in-person visits in their office suite or video visits, and each "
    "slot is open, booked or blocked. Patients search doctors by name or specialty, browse a doctor's slots "
    "filtered by status, visit type or date, and book an open slot with a reason for the visit; doctors who "
    "are not accepting new patients can only be booked by patients they have seen before. A scheduled "
    "appointment can be rescheduled into another open slot of the same doctor (keeping the same appointment "
    "record and releasing the old slot), have its reason or notes edited, or be cancelled, which frees the "
    "slot for others. The portal lists the patient's prescriptions with the prescribing doctor, strength, "
    "instructions, refills remaining, status (active, expired or discontinued) and default pharmacy. For an "
    "active prescription with refills left, the patient can request a refill at any partner pharmacy, see "
    "the status of refill requests (pending, approved, denied or withdrawn) and withdraw a pending request "
    "sent to the wrong place. Patients also exchange secure messages with their doctors, see which messages "
    "are unread, and keep their contact details and insurance information up to date. The environment "
    "covers the routine self-service tasks of a clinic patient: finding and booking care, fixing booking "
    "mistakes, handling medication refills and communicating with the care team."
)

TABLES = [
    {
        "name": "patients",
        "ddl": (
            "CREATE TABLE patients (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    full_name TEXT NOT NULL,\n"
            "    date_of_birth DATE NOT NULL,\n"
            "    email TEXT NOT NULL UNIQUE,\n"
            "    phone TEXT,\n"
            "    insurance_provider TEXT,\n"
            "    insurance_member_id TEXT,\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    updated_at DATETIME DEFAULT CURRENT_TIMESTAMP\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_patients_full_name ON patients(full_name);"],
    },
    {
        "name": "doctors",
        "ddl": (
            "CREATE TABLE doctors (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    full_name TEXT NOT NULL,\n"
            "    specialty TEXT NOT NULL,\n"
            "    office_location TEXT,\n"
            "    phone TEXT,\n"
            "    accepting_new_patients INTEGER NOT NULL DEFAULT 1 CHECK (accepting_new_patients IN (0, 1)),\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP\n"
            ");"
        ),
        "indexes": [
            "CREATE INDEX idx_doctors_specialty ON doctors(specialty);",
            "CREATE INDEX idx_doctors_full_name ON doctors(full_name);",
        ],
    },
    {
        "name": "pharmacies",
        "ddl": (
            "CREATE TABLE pharmacies (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    name TEXT NOT NULL UNIQUE,\n"
            "    address TEXT NOT NULL,\n"
            "    phone TEXT,\n"
            "    open_24_hours INTEGER NOT NULL DEFAULT 0 CHECK (open_24_hours IN (0, 1))\n"
            ");"
        ),
        "indexes": [],
    },
    {
        "name": "time_slots",
        "ddl": (
            "CREATE TABLE time_slots (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    doctor_id INTEGER NOT NULL,\n"
            "    start_time DATETIME NOT NULL,\n"
            "    end_time DATETIME NOT NULL,\n"
            "    slot_type TEXT NOT NULL CHECK (slot_type IN ('in_person', 'video')),\n"
            "    status TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'booked', 'blocked')),\n"
            "    CHECK (end_time > start_time),\n"
            "    UNIQUE (doctor_id, start_time),\n"
            "    FOREIGN KEY (doctor_id) REFERENCES doctors(id) ON DELETE CASCADE\n"
            ");"
        ),
        "indexes": [
            "CREATE INDEX idx_time_slots_doctor_start ON time_slots(doctor_id, start_time);",
            "CREATE INDEX idx_time_slots_status ON time_slots(status);",
        ],
    },
    {
        "name": "appointments",
        "ddl": (
            "CREATE TABLE appointments (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    patient_id INTEGER NOT NULL,\n"
            "    doctor_id INTEGER NOT NULL,\n"
            "    slot_id INTEGER NOT NULL,\n"
            "    reason TEXT NOT NULL,\n"
            "    visit_type TEXT NOT NULL CHECK (visit_type IN ('in_person', 'video')),\n"
            "    status TEXT NOT NULL DEFAULT 'scheduled'\n"
            "        CHECK (status IN ('scheduled', 'completed', 'cancelled', 'no_show')),\n"
            "    notes TEXT,\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    updated_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    cancelled_at DATETIME,\n"
            "    FOREIGN KEY (patient_id) REFERENCES patients(id),\n"
            "    FOREIGN KEY (doctor_id) REFERENCES doctors(id),\n"
            "    FOREIGN KEY (slot_id) REFERENCES time_slots(id)\n"
            ");"
        ),
        "indexes": [
            "CREATE INDEX idx_appointments_patient_status ON appointments(patient_id, status);",
            "CREATE INDEX idx_appointments_slot_id ON appointments(slot_id);",
        ],
    },
    {
        "name": "prescriptions",
        "ddl": (
            "CREATE TABLE prescriptions (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    patient_id INTEGER NOT NULL,\n"
            "    doctor_id INTEGER NOT NULL,\n"
            "    pharmacy_id INTEGER,\n"
            "    medication_name TEXT NOT NULL,\n"
            "    dosage TEXT NOT NULL,\n"
            "    instructions TEXT,\n"
            "    refills_remaining INTEGER NOT NULL DEFAULT 0 CHECK (refills_remaining >= 0),\n"
            "    status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'expired', 'discontinued')),\n"
            "    prescribed_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    expires_at DATETIME,\n"
            "    FOREIGN KEY (patient_id) REFERENCES patients(id),\n"
            "    FOREIGN KEY (doctor_id) REFERENCES doctors(id),\n"
            "    FOREIGN KEY (pharmacy_id) REFERENCES pharmacies(id)\n"
            ");"
        ),
        "indexes": [
            "CREATE INDEX idx_prescriptions_patient_status ON prescriptions(patient_id, status);",
            "CREATE INDEX idx_prescriptions_medication ON prescriptions(medication_name);",
        ],
    },
    {
        "name": "refill_requests",
        "ddl": (
            "CREATE TABLE refill_requests (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    prescription_id INTEGER NOT NULL,\n"
            "    pharmacy_id INTEGER NOT NULL,\n"
            "    status TEXT NOT NULL DEFAULT 'pending'\n"
            "        CHECK (status IN ('pending', 'approved', 'denied', 'withdrawn')),\n"
            "    note TEXT,\n"
            "    requested_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    resolved_at DATETIME,\n"
            "    FOREIGN KEY (prescription_id) REFERENCES prescriptions(id) ON DELETE CASCADE,\n"
            "    FOREIGN KEY (pharmacy_id) REFERENCES pharmacies(id)\n"
            ");"
        ),
        "indexes": [
            "CREATE INDEX idx_refill_requests_prescription_status ON refill_requests(prescription_id, status);",
        ],
    },
    {
        "name": "messages",
        "ddl": (
            "CREATE TABLE messages (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    patient_id INTEGER NOT NULL,\n"
            "    doctor_id INTEGER NOT NULL,\n"
            "    direction TEXT NOT NULL CHECK (direction IN ('to_doctor', 'from_doctor')),\n"
            "    subject TEXT NOT NULL,\n"
            "    body TEXT NOT NULL,\n"
            "    is_read INTEGER NOT NULL DEFAULT 0 CHECK (is_read IN (0, 1)),\n"
            "    sent_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    FOREIGN KEY (patient_id) REFERENCES patients(id),\n"
            "    FOREIGN KEY (doctor_id) REFERENCES doctors(id)\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_messages_patient_sent ON messages(patient_id, sent_at);"],
    },
]


def _slot(sid: int, doctor: int, day: int, hour: int, minute: int, kind: str, status: str) -> str:
    start = f"datetime('now', 'start of day', '{day:+d} days', '+{hour} hours', '+{minute} minutes')"
    end = f"datetime('now', 'start of day', '{day:+d} days', '+{hour} hours', '+{minute + 30} minutes')"
    return (f"INSERT INTO time_slots (id, doctor_id, start_time, end_time, slot_type, status) "
            f"VALUES ({sid}, {doctor}, {start}, {end}, '{kind}', '{status}');")


SAMPLE = [
    {
        "table_name": "patients",
        "reasoning": "Patient 1 (Maya Thompson) is the logged-in user; three other patients own appointments and "
        "messages that must stay untouched.",
        "insert_statements": [
            "INSERT INTO patients (id, full_name, date_of_birth, email, phone, insurance_provider, insurance_member_id, created_at, updated_at) VALUES (1, 'Maya Thompson', '1986-04-12', 'maya.thompson@example.com', '555-201-7788', 'Northstar Mutual', 'NSM-448120', datetime('now', '-900 days'), datetime('now', '-60 days'));",
            "INSERT INTO patients (id, full_name, date_of_birth, email, phone, insurance_provider, insurance_member_id, created_at, updated_at) VALUES (2, 'Daniel Cho', '1992-11-03', 'daniel.cho@example.com', '555-310-4421', 'Blue Harbor Health', 'BHH-20931', datetime('now', '-500 days'), datetime('now', '-20 days'));",
            "INSERT INTO patients (id, full_name, date_of_birth, email, phone, insurance_provider, insurance_member_id, created_at, updated_at) VALUES (3, 'Fatima Haddad', '1975-07-28', 'fatima.haddad@example.com', '555-442-9083', 'Cedar Valley Insurance', 'CVI-77310', datetime('now', '-1200 days'), datetime('now', '-200 days'));",
            "INSERT INTO patients (id, full_name, date_of_birth, email, phone, insurance_provider, insurance_member_id, created_at, updated_at) VALUES (4, 'George Whitfield', '1958-02-15', 'george.whitfield@example.com', '555-118-2040', 'Northstar Mutual', 'NSM-100877', datetime('now', '-2000 days'), datetime('now', '-5 days'));",
        ],
    },
    {
        "table_name": "doctors",
        "reasoning": "Five doctors; two share the first name Amara (Okoye, internal medicine, and Osei, "
        "pediatrics) so the right recipient must be picked by full name.",
        "insert_statements": [
            "INSERT INTO doctors (id, full_name, specialty, office_location, phone, accepting_new_patients, created_at) VALUES (1, 'Amara Okoye', 'Internal Medicine', 'Suite 210', '555-0201', 1, datetime('now', '-3000 days'));",
            "INSERT INTO doctors (id, full_name, specialty, office_location, phone, accepting_new_patients, created_at) VALUES (2, 'Amara Osei', 'Pediatrics', 'Suite 105', '555-0202', 0, datetime('now', '-2500 days'));",
            "INSERT INTO doctors (id, full_name, specialty, office_location, phone, accepting_new_patients, created_at) VALUES (3, 'Lena Fischer', 'Dermatology', 'Suite 318', '555-0203', 1, datetime('now', '-1800 days'));",
            "INSERT INTO doctors (id, full_name, specialty, office_location, phone, accepting_new_patients, created_at) VALUES (4, 'Samuel Park', 'Orthopedics', 'Suite 402', '555-0204', 1, datetime('now', '-2200 days'));",
            "INSERT INTO doctors (id, full_name, specialty, office_location, phone, accepting_new_patients, created_at) VALUES (5, 'Rafael Mendes', 'Cardiology', 'Suite 500', '555-0205', 0, datetime('now', '-2800 days'));",
        ],
    },
    {
        "table_name": "pharmacies",
        "reasoning": "Four partner pharmacies: Maple Street is the default for most prescriptions, Harbor View "
        "and CityCare are alternatives used by the refill tasks.",
        "insert_statements": [
            "INSERT INTO pharmacies (id, name, address, phone, open_24_hours) VALUES (1, 'Maple Street Pharmacy', '42 Maple Street', '555-0301', 0);",
            "INSERT INTO pharmacies (id, name, address, phone, open_24_hours) VALUES (2, 'Harbor View Pharmacy', '9 Harbor View Drive', '555-0302', 0);",
            "INSERT INTO pharmacies (id, name, address, phone, open_24_hours) VALUES (3, 'CityCare Pharmacy', '1500 Main Street', '555-0303', 1);",
            "INSERT INTO pharmacies (id, name, address, phone, open_24_hours) VALUES (4, 'Greenway Drugs', '77 Greenway Boulevard', '555-0304', 0);",
        ],
    },
    {
        "table_name": "time_slots",
        "reasoning": "Slots are anchored at the start of a day so their clock times are fixed (for example Dr. "
        "Okoye's 10:00 video and 14:00 in-person slots three days ahead). Dr. Fischer has an earlier open video "
        "slot than her earliest open in-person slot, a booked in-person slot in between and three open video "
        "slots in all. Booked slots match the appointments below.",
        "insert_statements": [
            _slot(1, 1, 3, 10, 0, "video", "booked"),
            _slot(2, 1, 3, 14, 0, "in_person", "open"),
            _slot(3, 1, 3, 15, 0, "in_person", "open"),
            _slot(4, 1, 6, 9, 0, "in_person", "open"),
            _slot(5, 1, -20, 9, 0, "in_person", "booked"),
            _slot(6, 2, 2, 11, 0, "in_person", "open"),
            _slot(7, 2, 4, 11, 0, "video", "open"),
            _slot(8, 3, 1, 8, 30, "video", "open"),
            _slot(9, 3, 2, 13, 0, "in_person", "open"),
            _slot(10, 3, 2, 16, 0, "video", "open"),
            _slot(11, 3, 5, 9, 0, "in_person", "open"),
            _slot(12, 3, 7, 10, 0, "video", "open"),
            _slot(13, 3, 1, 15, 0, "in_person", "booked"),
            _slot(14, 3, 3, 11, 0, "in_person", "blocked"),
            _slot(15, 4, 5, 10, 30, "in_person", "booked"),
            _slot(16, 4, 12, 8, 0, "in_person", "booked"),
            _slot(17, 4, -30, 10, 0, "in_person", "booked"),
            _slot(18, 4, 5, 11, 30, "in_person", "open"),
            _slot(19, 4, 8, 14, 0, "video", "open"),
            _slot(20, 5, 9, 9, 0, "in_person", "booked"),
            _slot(21, 5, 9, 10, 0, "in_person", "open"),
        ],
    },
    {
        "table_name": "appointments",
        "reasoning": "Appointment 1 is the blood pressure check booked yesterday into Dr. Okoye's video slot by "
        "mistake. Patient 1 has two upcoming visits with Dr. Park (knee follow-up and shoulder evaluation) and "
        "two completed past visits; other patients hold the remaining booked slots.",
        "insert_statements": [
            "INSERT INTO appointments (id, patient_id, doctor_id, slot_id, reason, visit_type, status, notes, created_at, updated_at, cancelled_at) VALUES (1, 1, 1, 1, 'blood pressure check', 'video', 'scheduled', NULL, datetime('now', '-1 days'), datetime('now', '-1 days'), NULL);",
            "INSERT INTO appointments (id, patient_id, doctor_id, slot_id, reason, visit_type, status, notes, created_at, updated_at, cancelled_at) VALUES (2, 1, 1, 5, 'annual physical', 'in_person', 'completed', 'Fasting labs drawn.', datetime('now', '-40 days'), datetime('now', '-20 days'), NULL);",
            "INSERT INTO appointments (id, patient_id, doctor_id, slot_id, reason, visit_type, status, notes, created_at, updated_at, cancelled_at) VALUES (3, 1, 4, 15, 'knee follow-up', 'in_person', 'scheduled', NULL, datetime('now', '-10 days'), datetime('now', '-10 days'), NULL);",
            "INSERT INTO appointments (id, patient_id, doctor_id, slot_id, reason, visit_type, status, notes, created_at, updated_at, cancelled_at) VALUES (4, 1, 4, 16, 'shoulder evaluation', 'in_person', 'scheduled', NULL, datetime('now', '-4 days'), datetime('now', '-4 days'), NULL);",
            "INSERT INTO appointments (id, patient_id, doctor_id, slot_id, reason, visit_type, status, notes, created_at, updated_at, cancelled_at) VALUES (5, 1, 4, 17, 'knee pain', 'in_person', 'completed', 'Referred to physiotherapy.', datetime('now', '-45 days'), datetime('now', '-30 days'), NULL);",
            "INSERT INTO appointments (id, patient_id, doctor_id, slot_id, reason, visit_type, status, notes, created_at, updated_at, cancelled_at) VALUES (6, 2, 3, 13, 'rash on forearm', 'in_person', 'scheduled', NULL, datetime('now', '-6 days'), datetime('now', '-6 days'), NULL);",
            "INSERT INTO appointments (id, patient_id, doctor_id, slot_id, reason, visit_type, status, notes, created_at, updated_at, cancelled_at) VALUES (7, 3, 5, 20, 'palpitations', 'in_person', 'scheduled', NULL, datetime('now', '-8 days'), datetime('now', '-8 days'), NULL);",
        ],
    },
    {
        "table_name": "prescriptions",
        "reasoning": "Patient 1 has an active and a discontinued Lisinopril, an active Atorvastatin (Dr. Okoye) "
        "and an expired one (Dr. Mendes), plus active Metformin and Meloxicam, so status matters when reading "
        "refills or prescribers.",
        "insert_statements": [
            "INSERT INTO prescriptions (id, patient_id, doctor_id, pharmacy_id, medication_name, dosage, instructions, refills_remaining, status, prescribed_at, expires_at) VALUES (1, 1, 1, 1, 'Lisinopril', '10 mg', 'one tablet once daily', 3, 'active', datetime('now', '-60 days'), datetime('now', '+305 days'));",
            "INSERT INTO prescriptions (id, patient_id, doctor_id, pharmacy_id, medication_name, dosage, instructions, refills_remaining, status, prescribed_at, expires_at) VALUES (2, 1, 1, 3, 'Lisinopril', '5 mg', 'one tablet once daily', 0, 'discontinued', datetime('now', '-400 days'), datetime('now', '-35 days'));",
            "INSERT INTO prescriptions (id, patient_id, doctor_id, pharmacy_id, medication_name, dosage, instructions, refills_remaining, status, prescribed_at, expires_at) VALUES (3, 1, 1, 1, 'Atorvastatin', '20 mg', 'one tablet at bedtime', 2, 'active', datetime('now', '-90 days'), datetime('now', '+275 days'));",
            "INSERT INTO prescriptions (id, patient_id, doctor_id, pharmacy_id, medication_name, dosage, instructions, refills_remaining, status, prescribed_at, expires_at) VALUES (4, 1, 5, 4, 'Atorvastatin', '10 mg', 'one tablet at bedtime', 4, 'expired', datetime('now', '-500 days'), datetime('now', '-135 days'));",
            "INSERT INTO prescriptions (id, patient_id, doctor_id, pharmacy_id, medication_name, dosage, instructions, refills_remaining, status, prescribed_at, expires_at) VALUES (5, 1, 1, 1, 'Metformin', '500 mg', 'one tablet twice daily with meals', 5, 'active', datetime('now', '-30 days'), datetime('now', '+335 days'));",
            "INSERT INTO prescriptions (id, patient_id, doctor_id, pharmacy_id, medication_name, dosage, instructions, refills_remaining, status, prescribed_at, expires_at) VALUES (6, 1, 4, 2, 'Meloxicam', '15 mg', 'one tablet daily with food', 1, 'active', datetime('now', '-25 days'), datetime('now', '+65 days'));",
            "INSERT INTO prescriptions (id, patient_id, doctor_id, pharmacy_id, medication_name, dosage, instructions, refills_remaining, status, prescribed_at, expires_at) VALUES (7, 2, 3, 2, 'Tretinoin cream', '0.025%', 'apply a thin layer at night', 2, 'active', datetime('now', '-15 days'), datetime('now', '+165 days'));",
        ],
    },
    {
        "table_name": "refill_requests",
        "reasoning": "Request 1 is yesterday's Lisinopril refill sent to CityCare Pharmacy by mistake; the others "
        "are resolved history or belong to another patient. Metformin has no request yet.",
        "insert_statements": [
            "INSERT INTO refill_requests (id, prescription_id, pharmacy_id, status, note, requested_at, resolved_at) VALUES (1, 1, 3, 'pending', NULL, datetime('now', '-1 days'), NULL);",
            "INSERT INTO refill_requests (id, prescription_id, pharmacy_id, status, note, requested_at, resolved_at) VALUES (2, 6, 2, 'approved', NULL, datetime('now', '-20 days'), datetime('now', '-19 days'));",
            "INSERT INTO refill_requests (id, prescription_id, pharmacy_id, status, note, requested_at, resolved_at) VALUES (3, 3, 1, 'approved', 'Running low', datetime('now', '-35 days'), datetime('now', '-34 days'));",
            "INSERT INTO refill_requests (id, prescription_id, pharmacy_id, status, note, requested_at, resolved_at) VALUES (4, 7, 2, 'pending', NULL, datetime('now', '-2 days'), NULL);",
        ],
    },
    {
        "table_name": "messages",
        "reasoning": "A short message history between patient 1 and her doctors (two unread replies) plus one "
        "message of another patient.",
        "insert_statements": [
            "INSERT INTO messages (id, patient_id, doctor_id, direction, subject, body, is_read, sent_at) VALUES (1, 1, 1, 'to_doctor', 'Question about dosage', 'Should I take Lisinopril in the morning or evening?', 1, datetime('now', '-15 days'));",
            "INSERT INTO messages (id, patient_id, doctor_id, direction, subject, body, is_read, sent_at) VALUES (2, 1, 1, 'from_doctor', 'Re: Question about dosage', 'Morning is best; keep logging your blood pressure.', 1, datetime('now', '-14 days'));",
            "INSERT INTO messages (id, patient_id, doctor_id, direction, subject, body, is_read, sent_at) VALUES (3, 1, 4, 'from_doctor', 'Knee exercises', 'Attached are the quad strengthening exercises we discussed.', 0, datetime('now', '-5 days'));",
            "INSERT INTO messages (id, patient_id, doctor_id, direction, subject, body, is_read, sent_at) VALUES (4, 1, 3, 'from_doctor', 'Welcome to dermatology', 'Please bring a list of current skin products to your first visit.', 0, datetime('now', '-2 days'));",
            "INSERT INTO messages (id, patient_id, doctor_id, direction, subject, body, is_read, sent_at) VALUES (5, 1, 4, 'to_doctor', 'Brace sizing', 'Which brace size should I order for my knee?', 1, datetime('now', '-1 days'));",
            "INSERT INTO messages (id, patient_id, doctor_id, direction, subject, body, is_read, sent_at) VALUES (6, 2, 3, 'to_doctor', 'Rash update', 'The rash has spread a little since last week.', 1, datetime('now', '-3 days'));",
        ],
    },
]

# A verifier: the kit's id-keyed table diffs and answer helpers, then one task's check().
_verifier = partial(verifier, ID_DIFF_PRELUDE)

TASKS = [
    {
        "task": "Which doctor prescribed my currently active Atorvastatin prescription?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": _verifier('''
if not unchanged_except():
    return False
rows = fetch(initial_db_path,
             "SELECT d.full_name FROM prescriptions p JOIN doctors d ON d.id = p.doctor_id "
             "WHERE p.patient_id = 1 AND p.medication_name = 'Atorvastatin' AND p.status = 'active'")
if len(rows) != 1:
    return False
expected = rows[0][0].split()[-1].lower()
decoys = {r[0].split()[-1].lower() for r in fetch(
    initial_db_path,
    "SELECT d.full_name FROM prescriptions p JOIN doctors d ON d.id = p.doctor_id "
    "WHERE p.patient_id = 1 AND p.medication_name = 'Atorvastatin' AND p.status != 'active'")} - {expected}
text = answer_text()
return expected in text and not any(d in text for d in decoys)
'''),
        "solution": {
            "calls": [{"tool": "list_my_prescriptions", "arguments": {"status": "active", "medication": "Atorvastatin"}}],
            "final_answer": "Your active Atorvastatin 20 mg prescription was written by Dr. Amara Okoye.",
        },
        "wrong": {
            "calls": [{"tool": "list_my_prescriptions", "arguments": {"medication": "Atorvastatin"}}],
            "final_answer": "Dr. Rafael Mendes prescribed your Atorvastatin.",
        },
    },
    {
        "task": "How many refills are left on my active Lisinopril prescription?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": _verifier('''
if not unchanged_except():
    return False
rows = fetch(initial_db_path,
             "SELECT refills_remaining FROM prescriptions "
             "WHERE patient_id = 1 AND medication_name = 'Lisinopril' AND status = 'active'")
if len(rows) != 1:
    return False
text = answer_text()
return bool(text.strip()) and mentions_number(text, rows[0][0])
'''),
        "solution": {
            "calls": [{"tool": "list_my_prescriptions", "arguments": {"medication": "Lisinopril"}}],
            "final_answer": "Your active Lisinopril 10 mg prescription has 3 refills left.",
        },
        "wrong": {
            "calls": [{"tool": "list_my_prescriptions", "arguments": {"medication": "Lisinopril"}}],
            "final_answer": "Your Lisinopril prescription has 0 refills remaining.",
        },
    },
    {
        "task": "How many open video-visit slots does Dr. Lena Fischer currently have?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": _verifier('''
if not unchanged_except():
    return False
rows = fetch(initial_db_path,
             "SELECT COUNT(*) FROM time_slots s JOIN doctors d ON d.id = s.doctor_id "
             "WHERE d.full_name = 'Lena Fischer' AND s.status = 'open' AND s.slot_type = 'video'")
text = answer_text()
return bool(text.strip()) and mentions_number(text, rows[0][0])
'''),
        "solution": {
            "calls": [
                {"tool": "search_doctors", "arguments": {"name": "Lena Fischer"}},
                {"tool": "list_doctor_slots", "arguments": {"doctor_id": 3, "status": "open", "slot_type": "video"}},
            ],
            "final_answer": "Dr. Lena Fischer has 3 open video-visit slots.",
        },
        "wrong": {
            "calls": [
                {"tool": "search_doctors", "arguments": {"name": "Fischer"}},
                {"tool": "list_doctor_slots", "arguments": {"doctor_id": 3, "status": "open"}},
            ],
            "final_answer": "Dr. Fischer has 5 open slots.",
        },
    },
    {
        "task": "Book the earliest open in-person slot with dermatologist Dr. Lena Fischer for a mole check.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
doc = fetch(initial_db_path, "SELECT id FROM doctors WHERE full_name = 'Lena Fischer'")
if len(doc) != 1:
    return False
doctor_id = doc[0][0]
slot = fetch(initial_db_path,
             "SELECT id FROM time_slots WHERE doctor_id = ? AND status = 'open' AND slot_type = 'in_person' "
             "ORDER BY start_time ASC, id ASC LIMIT 1", (doctor_id,))
if len(slot) != 1:
    return False
slot_id = slot[0][0]
if not unchanged_except("appointments", "time_slots"):
    return False
_, appts, added, removed, changed = diff("appointments")
if len(added) != 1 or removed or changed:
    return False
appt = appts[added[0]]
if (appt["patient_id"], appt["doctor_id"], appt["slot_id"]) != (1, doctor_id, slot_id):
    return False
if appt["status"] != "scheduled" or appt["visit_type"] != "in_person" or "mole" not in appt["reason"].lower():
    return False
_, slots, s_added, s_removed, s_changed = diff("time_slots")
return not s_added and not s_removed and s_changed == [slot_id] and slots[slot_id]["status"] == "booked"
'''),
        "solution": {
            "calls": [
                {"tool": "search_doctors", "arguments": {"specialty": "Dermatology"}},
                {"tool": "list_doctor_slots", "arguments": {"doctor_id": 3, "status": "open", "slot_type": "in_person"}},
                {"tool": "book_appointment", "arguments": {"slot_id": 9, "reason": "mole check"}},
            ],
            "final_answer": "Booked Dr. Lena Fischer's earliest open in-person slot (in two days at 13:00) for a "
            "mole check.",
        },
        "wrong": {
            "calls": [
                {"tool": "search_doctors", "arguments": {"specialty": "Dermatology"}},
                {"tool": "list_doctor_slots", "arguments": {"doctor_id": 3, "status": "open"}},
                {"tool": "book_appointment", "arguments": {"slot_id": 8, "reason": "mole check"}},
            ],
            "final_answer": "Booked the earliest open slot with Dr. Fischer for a mole check.",
        },
    },
    {
        "task": "Cancel my upcoming knee follow-up appointment with Dr. Samuel Park.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
rows = fetch(initial_db_path,
             "SELECT a.id, a.slot_id FROM appointments a JOIN doctors d ON d.id = a.doctor_id "
             "WHERE d.full_name = 'Samuel Park' AND a.patient_id = 1 AND a.status = 'scheduled' "
             "AND lower(a.reason) LIKE '%knee%'")
if len(rows) != 1:
    return False
appt_id, slot_id = rows[0]
if not unchanged_except("appointments", "time_slots"):
    return False
_, appts, added, removed, changed = diff("appointments")
if added or removed or changed != [appt_id]:
    return False
if appts[appt_id]["status"] != "cancelled" or appts[appt_id]["cancelled_at"] is None:
    return False
_, slots, s_added, s_removed, s_changed = diff("time_slots")
return not s_added and not s_removed and s_changed == [slot_id] and slots[slot_id]["status"] == "open"
'''),
        "solution": {
            "calls": [
                {"tool": "list_my_appointments", "arguments": {"status": "scheduled"}},
                {"tool": "cancel_appointment", "arguments": {"appointment_id": 3}},
            ],
            "final_answer": "Your knee follow-up with Dr. Samuel Park has been cancelled.",
        },
        "wrong": {
            "calls": [
                {"tool": "list_my_appointments", "arguments": {"doctor_id": 4}},
                {"tool": "cancel_appointment", "arguments": {"appointment_id": 4}},
            ],
            "final_answer": "Cancelled your upcoming appointment with Dr. Park.",
        },
    },
    {
        "task": "Request a refill of my Metformin prescription and have it sent to Harbor View Pharmacy.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
rx = fetch(initial_db_path,
           "SELECT id FROM prescriptions WHERE patient_id = 1 AND medication_name = 'Metformin' "
           "AND status = 'active'")
pharmacy = fetch(initial_db_path, "SELECT id FROM pharmacies WHERE name = 'Harbor View Pharmacy'")
if len(rx) != 1 or len(pharmacy) != 1:
    return False
if not unchanged_except("refill_requests"):
    return False
_, reqs, added, removed, changed = diff("refill_requests")
if len(added) != 1 or removed or changed:
    return False
req = reqs[added[0]]
return (req["prescription_id"] == rx[0][0] and req["pharmacy_id"] == pharmacy[0][0]
        and req["status"] == "pending")
'''),
        "solution": {
            "calls": [
                {"tool": "list_my_prescriptions", "arguments": {"medication": "Metformin"}},
                {"tool": "list_pharmacies", "arguments": {"query": "Harbor View"}},
                {"tool": "request_refill", "arguments": {"prescription_id": 5, "pharmacy_id": 2}},
            ],
            "final_answer": "A refill of your Metformin 500 mg has been requested at Harbor View Pharmacy.",
        },
        "wrong": {
            "calls": [
                {"tool": "list_my_prescriptions", "arguments": {"medication": "Metformin"}},
                {"tool": "request_refill", "arguments": {"prescription_id": 5}},
            ],
            "final_answer": "Requested a Metformin refill.",
        },
    },
    {
        "task": "Send Dr. Amara Okoye a message with the subject 'Blood pressure readings' saying 'My home "
        "readings this week averaged 128/82.'",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
doc = fetch(initial_db_path, "SELECT id FROM doctors WHERE full_name = 'Amara Okoye'")
if len(doc) != 1:
    return False
if not unchanged_except("messages"):
    return False
_, msgs, added, removed, changed = diff("messages")
if len(added) != 1 or removed or changed:
    return False
msg = msgs[added[0]]
return (msg["patient_id"] == 1 and msg["doctor_id"] == doc[0][0] and msg["direction"] == "to_doctor"
        and msg["subject"].strip().lower() == "blood pressure readings" and "128/82" in msg["body"])
'''),
        "solution": {
            "calls": [
                {"tool": "search_doctors", "arguments": {"name": "Amara"}},
                {"tool": "send_message", "arguments": {
                    "doctor_id": 1, "subject": "Blood pressure readings",
                    "body": "My home readings this week averaged 128/82."}},
            ],
            "final_answer": "Your message about blood pressure readings was sent to Dr. Amara Okoye.",
        },
        "wrong": {
            "calls": [
                {"tool": "search_doctors", "arguments": {"name": "Amara"}},
                {"tool": "send_message", "arguments": {
                    "doctor_id": 2, "subject": "Blood pressure readings",
                    "body": "My home readings this week averaged 128/82."}},
            ],
            "final_answer": "Message sent to Dr. Amara.",
        },
    },
    {
        "task": "Update my phone number to 555-014-2233 and change my insurance provider to Blue Harbor Health.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
if not unchanged_except("patients"):
    return False
before, after, added, removed, changed = diff("patients")
if added or removed or changed != [1]:
    return False
old, new = before[1], after[1]
for col in ("full_name", "date_of_birth", "email", "insurance_member_id"):
    if new[col] != old[col]:
        return False
digits = re.sub(r"\\D", "", new["phone"] or "")
return digits == "5550142233" and (new["insurance_provider"] or "").strip().lower() == "blue harbor health"
'''),
        "solution": {
            "calls": [
                {"tool": "get_my_profile", "arguments": {}},
                {"tool": "update_my_profile", "arguments": {
                    "phone": "555-014-2233", "insurance_provider": "Blue Harbor Health"}},
            ],
            "final_answer": "Your phone number is now 555-014-2233 and your insurance provider is Blue Harbor Health.",
        },
        "wrong": {
            "calls": [
                {"tool": "get_my_profile", "arguments": {}},
                {"tool": "update_my_profile", "arguments": {"phone": "555-014-2233"}},
            ],
            "final_answer": "Your phone number has been updated.",
        },
    },
    {
        "task": "My blood pressure check with Dr. Amara Okoye that I booked yesterday went into her 10:00 video "
        "slot by mistake; move that same appointment to her 14:00 in-person slot on the same day.",
        "task_type": "state_mutating",
        "repair": True,
        "verifier": _verifier('''
rows = fetch(initial_db_path,
             "SELECT a.id, a.slot_id, a.doctor_id, s.start_time FROM appointments a "
             "JOIN doctors d ON d.id = a.doctor_id JOIN time_slots s ON s.id = a.slot_id "
             "WHERE d.full_name = 'Amara Okoye' AND a.patient_id = 1 AND a.status = 'scheduled' "
             "AND a.visit_type = 'video' AND lower(a.reason) LIKE '%blood pressure%'")
if len(rows) != 1:
    return False
appt_id, old_slot, doctor_id, old_start = rows[0]
target = fetch(initial_db_path,
               "SELECT id FROM time_slots WHERE doctor_id = ? AND slot_type = 'in_person' "
               "AND date(start_time) = date(?) AND strftime('%H:%M', start_time) = '14:00'",
               (doctor_id, old_start))
if len(target) != 1:
    return False
new_slot = target[0][0]
if not unchanged_except("appointments", "time_slots"):
    return False
before, after, added, removed, changed = diff("appointments")
if added or removed or changed != [appt_id]:
    return False
old, new = before[appt_id], after[appt_id]
if new["slot_id"] != new_slot or new["visit_type"] != "in_person" or new["status"] != "scheduled":
    return False
if new["reason"] != old["reason"] or new["doctor_id"] != old["doctor_id"] or new["patient_id"] != 1:
    return False
_, slots, s_added, s_removed, s_changed = diff("time_slots")
if s_added or s_removed or s_changed != sorted([old_slot, new_slot]):
    return False
return slots[old_slot]["status"] == "open" and slots[new_slot]["status"] == "booked"
'''),
        "solution": {
            "calls": [
                {"tool": "list_my_appointments", "arguments": {"status": "scheduled"}},
                {"tool": "list_doctor_slots", "arguments": {"doctor_id": 1, "status": "open", "slot_type": "in_person"}},
                {"tool": "reschedule_appointment", "arguments": {"appointment_id": 1, "new_slot_id": 2}},
            ],
            "final_answer": "Your blood pressure check with Dr. Okoye was moved to her 14:00 in-person slot on the "
            "same day; the 10:00 video slot was released.",
        },
        "wrong": {
            "calls": [
                {"tool": "list_doctor_slots", "arguments": {"doctor_id": 1, "status": "open"}},
                {"tool": "book_appointment", "arguments": {"slot_id": 2, "reason": "blood pressure check"}},
            ],
            "final_answer": "Booked the 14:00 in-person slot with Dr. Okoye for your blood pressure check.",
        },
    },
    {
        "task": "The Lisinopril refill I requested yesterday was sent to CityCare Pharmacy by mistake; withdraw it "
        "and request the refill at Maple Street Pharmacy instead.",
        "task_type": "state_mutating",
        "repair": True,
        "verifier": _verifier('''
rx = fetch(initial_db_path,
           "SELECT id FROM prescriptions WHERE patient_id = 1 AND medication_name = 'Lisinopril' "
           "AND status = 'active'")
maple = fetch(initial_db_path, "SELECT id FROM pharmacies WHERE name = 'Maple Street Pharmacy'")
if len(rx) != 1 or len(maple) != 1:
    return False
rx_id = rx[0][0]
mistaken = fetch(initial_db_path,
                 "SELECT r.id FROM refill_requests r JOIN pharmacies p ON p.id = r.pharmacy_id "
                 "WHERE r.prescription_id = ? AND r.status = 'pending' AND p.name = 'CityCare Pharmacy'",
                 (rx_id,))
if len(mistaken) != 1:
    return False
bad_id = mistaken[0][0]
if not unchanged_except("refill_requests"):
    return False
_, reqs, added, removed, changed = diff("refill_requests")
if len(added) != 1:
    return False
if removed == [bad_id] and not changed:
    pass
elif changed == [bad_id] and not removed:
    if reqs[bad_id]["status"] != "withdrawn":
        return False
else:
    return False
new = reqs[added[0]]
return new["prescription_id"] == rx_id and new["pharmacy_id"] == maple[0][0] and new["status"] == "pending"
'''),
        "solution": {
            "calls": [
                {"tool": "list_my_refill_requests", "arguments": {"status": "pending"}},
                {"tool": "withdraw_refill_request", "arguments": {"request_id": 1}},
                {"tool": "list_pharmacies", "arguments": {"query": "Maple"}},
                {"tool": "request_refill", "arguments": {"prescription_id": 1, "pharmacy_id": 1}},
            ],
            "final_answer": "Withdrew the Lisinopril refill sent to CityCare Pharmacy and requested it at Maple "
            "Street Pharmacy instead.",
        },
        "wrong": {
            "calls": [
                {"tool": "list_my_prescriptions", "arguments": {"medication": "Lisinopril", "status": "active"}},
                {"tool": "request_refill", "arguments": {"prescription_id": 1, "pharmacy_id": 1}},
            ],
            "final_answer": "Requested the Lisinopril refill at Maple Street Pharmacy.",
        },
    },
]

PROBES = [
    {"tool": "list_my_messages", "arguments": {}},
    {"tool": "list_my_messages", "arguments": {"unread_only": True}},
    {"tool": "list_my_messages", "arguments": {"doctor_id": 4}},
    {"tool": "update_appointment_details", "arguments": {"appointment_id": 4, "notes": "Bringing my MRI images."}},
    {"tool": "update_appointment_details", "arguments": {"appointment_id": 2, "reason": "annual physical"}},
    {"tool": "search_doctors", "arguments": {"name": "Dr. Samuel Park"}},
    {"tool": "search_doctors", "arguments": {"accepting_new_patients": False}},
    {"tool": "list_doctor_slots", "arguments": {"doctor_id": 1, "slot_type": "phone"}},
    {"tool": "list_doctor_slots", "arguments": {"doctor_id": 3, "on_date": "not-a-date"}},
    {"tool": "list_doctor_slots", "arguments": {"doctor_id": 99}},
    {"tool": "book_appointment", "arguments": {"slot_id": 13, "reason": "skin check"}},
    {"tool": "book_appointment", "arguments": {"slot_id": 6, "reason": "consultation"}},
    {"tool": "reschedule_appointment", "arguments": {"appointment_id": 3, "new_slot_id": 9}},
    {"tool": "reschedule_appointment", "arguments": {"appointment_id": 3, "new_slot_id": 16}},
    {"tool": "cancel_appointment", "arguments": {"appointment_id": 5}},
    {"tool": "request_refill", "arguments": {"prescription_id": 2}},
    {"tool": "request_refill", "arguments": {"prescription_id": 1}},
    {"tool": "withdraw_refill_request", "arguments": {"request_id": 2}},
    {"tool": "update_my_profile", "arguments": {"email": "daniel.cho@example.com"}},
    {"tool": "send_message", "arguments": {"doctor_id": 42, "subject": "Hello", "body": "Test"}},
]

# Task families (awm.scenarios.families): the practice set's parameterised tasks, one instance per slot row.
_DOCTOR_SLOTS = "SELECT id AS doctor_id, full_name AS doctor, specialty FROM doctors ORDER BY id"
_MY_RX_SLOTS = ("SELECT p.id AS rx_id, p.medication_name AS medication, p.dosage, p.refills_remaining AS refills, "
                "d.full_name AS doctor FROM prescriptions p JOIN doctors d ON d.id = p.doctor_id "
                "WHERE p.patient_id = 1 ORDER BY p.id")
FAMILIES = [
    {
        "family": "doctor_specialty",
        "task_type": "info_seeking",
        "slots": _DOCTOR_SLOTS,
        "task": "What is Dr. {doctor}'s medical specialty?",
        "verifier": _verifier,
        "check": 'return unchanged_except() and P["specialty"].lower() in answer_text()',
        "solution": {"calls": [{"tool": "search_doctors", "arguments": {"name": "{doctor}"}}],
                     "final_answer": "Dr. {doctor} specializes in {specialty}."},
    },
    {
        "family": "doctor_open_slots",
        "task_type": "info_seeking",
        "slots": "SELECT d.id AS doctor_id, d.full_name AS doctor, (SELECT COUNT(*) FROM time_slots s "
                 "WHERE s.doctor_id = d.id AND s.status = 'open') AS open_slots FROM doctors d ORDER BY d.id",
        "task": "How many open appointment slots, of any visit type, does Dr. {doctor} have?",
        "verifier": _verifier,
        "check": 'return unchanged_except() and mentions_number(answer_text(), P["open_slots"])',
        "solution": {"calls": [{"tool": "search_doctors", "arguments": {"name": "{doctor}"}},
                               {"tool": "list_doctor_slots", "arguments": {"doctor_id": "{doctor_id}",
                                                                           "status": "open"}}],
                     "final_answer": "Dr. {doctor} has {open_slots} open slots."},
    },
    {
        "family": "prescription_prescriber",
        "task_type": "info_seeking",
        "slots": _MY_RX_SLOTS,
        "task": "Which doctor wrote my {medication} {dosage} prescription?",
        "verifier": _verifier,
        "check": '''
if not unchanged_except():
    return False
text = answer_text()
others = [r[0].lower() for r in fetch(initial_db_path, "SELECT full_name FROM doctors WHERE full_name != ?",
                                      (P["doctor"],))]
return P["doctor"].lower() in text and not any(o in text for o in others)
''',
        "solution": {"calls": [{"tool": "list_my_prescriptions", "arguments": {"medication": "{medication}"}}],
                     "final_answer": "Your {medication} {dosage} prescription was written by Dr. {doctor}."},
    },
    {
        "family": "prescription_refills",
        "task_type": "info_seeking",
        "slots": _MY_RX_SLOTS,
        "task": "How many refills remain on my {medication} {dosage} prescription?",
        "verifier": _verifier,
        "check": 'return unchanged_except() and mentions_number(answer_text(), P["refills"])',
        "solution": {"calls": [{"tool": "list_my_prescriptions", "arguments": {"medication": "{medication}"}}],
                     "final_answer": "{refills} refills remain on your {medication} {dosage} prescription."},
    },
    {
        "family": "refill_at_pharmacy",
        "task_type": "state_mutating",
        # my refillable prescriptions paired with every pharmacy other than the default and no pending request there
        "slots": "SELECT p.id AS rx_id, p.medication_name AS medication, p.dosage, ph.id AS pharmacy_id, "
                 "ph.name AS pharmacy FROM prescriptions p JOIN pharmacies ph ON ph.id <> COALESCE(p.pharmacy_id, 0) "
                 "WHERE p.patient_id = 1 AND p.status = 'active' AND p.refills_remaining > 0 AND NOT EXISTS "
                 "(SELECT 1 FROM refill_requests r WHERE r.prescription_id = p.id AND r.pharmacy_id = ph.id "
                 "AND r.status = 'pending') ORDER BY p.id, ph.id",
        "limit": 10,
        "task": "Please send a refill request for my {medication} {dosage} to {pharmacy}.",
        "verifier": _verifier,
        "check": '''
if not unchanged_except("refill_requests"):
    return False
_, after, added, removed, changed = diff("refill_requests")
if len(added) != 1 or removed or changed:
    return False
req = after[added[0]]
return (req["prescription_id"] == P["rx_id"] and req["pharmacy_id"] == P["pharmacy_id"]
        and req["status"] == "pending")
''',
        "solution": {"calls": [{"tool": "list_my_prescriptions", "arguments": {"medication": "{medication}",
                                                                               "status": "active"}},
                               {"tool": "list_pharmacies", "arguments": {"query": "{pharmacy}"}},
                               {"tool": "request_refill", "arguments": {"prescription_id": "{rx_id}",
                                                                        "pharmacy_id": "{pharmacy_id}"}}],
                     "final_answer": "A refill of your {medication} {dosage} has been requested at {pharmacy}."},
    },
    {
        "family": "message_office_hours",
        "task_type": "state_mutating",
        "slots": _DOCTOR_SLOTS,
        "task": "Send Dr. {doctor} a message with the subject 'Office hours' asking 'What are your office hours "
                "next week?'",
        "verifier": _verifier,
        "check": '''
if not unchanged_except("messages"):
    return False
_, after, added, removed, changed = diff("messages")
if len(added) != 1 or removed or changed:
    return False
msg = after[added[0]]
return (msg["patient_id"] == 1 and msg["doctor_id"] == P["doctor_id"] and msg["direction"] == "to_doctor"
        and msg["subject"].strip().lower() == "office hours"
        and "what are your office hours next week" in msg["body"].lower())
''',
        "solution": {"calls": [{"tool": "search_doctors", "arguments": {"name": "{doctor}"}},
                               {"tool": "send_message", "arguments": {
                                   "doctor_id": "{doctor_id}", "subject": "Office hours",
                                   "body": "What are your office hours next week?"}}],
                     "final_answer": "Your message about office hours was sent to Dr. {doctor}."},
    },
    {
        "family": "book_earliest_slot",
        "task_type": "state_mutating",
        # doctors I may book (accepting new patients, or seen before) with their earliest open slot of each type
        "slots": "SELECT * FROM (SELECT d.id AS doctor_id, d.full_name AS doctor, k.kind, "
                 "CASE k.kind WHEN 'video' THEN 'video' ELSE 'in-person' END AS kind_text, "
                 "CASE d.specialty WHEN 'Internal Medicine' THEN 'medication review' WHEN 'Dermatology' "
                 "THEN 'skin rash' WHEN 'Orthopedics' THEN 'sprained ankle' ELSE 'consultation' END AS reason, "
                 "(SELECT s.id FROM time_slots s WHERE s.doctor_id = d.id AND s.status = 'open' "
                 "AND s.slot_type = k.kind ORDER BY s.start_time, s.id LIMIT 1) AS slot_id "
                 "FROM doctors d CROSS JOIN (SELECT 'in_person' AS kind UNION ALL SELECT 'video') k "
                 "WHERE d.accepting_new_patients = 1 OR EXISTS (SELECT 1 FROM appointments a "
                 "WHERE a.patient_id = 1 AND a.doctor_id = d.id)) WHERE slot_id IS NOT NULL "
                 "ORDER BY doctor_id, kind",
        "task": "Book Dr. {doctor}'s earliest open {kind_text} slot for a {reason}.",
        "verifier": _verifier,
        "check": '''
if not unchanged_except("appointments", "time_slots"):
    return False
_, appts, added, removed, changed = diff("appointments")
if len(added) != 1 or removed or changed:
    return False
appt = appts[added[0]]
if (appt["patient_id"], appt["doctor_id"], appt["slot_id"]) != (1, P["doctor_id"], P["slot_id"]):
    return False
if appt["status"] != "scheduled" or appt["visit_type"] != P["kind"] or P["reason"] not in appt["reason"].lower():
    return False
_, slots, s_added, s_removed, s_changed = diff("time_slots")
return not s_added and not s_removed and s_changed == [P["slot_id"]] and slots[P["slot_id"]]["status"] == "booked"
''',
        "solution": {"calls": [{"tool": "search_doctors", "arguments": {"name": "{doctor}"}},
                               {"tool": "list_doctor_slots", "arguments": {"doctor_id": "{doctor_id}",
                                                                           "status": "open",
                                                                           "slot_type": "{kind}"}},
                               {"tool": "book_appointment", "arguments": {"slot_id": "{slot_id}",
                                                                          "reason": "{reason}"}}],
                     "final_answer": "Booked Dr. {doctor}'s earliest open {kind_text} slot for a {reason}."},
    },
]
