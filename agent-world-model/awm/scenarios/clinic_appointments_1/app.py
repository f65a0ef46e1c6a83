from fastapi import FastAPI, Query, Path, Body, HTTPException
from pydantic import BaseModel, Field, ConfigDict
from typing import Optional, List
from sqlalchemy import (
    create_engine,
    Column,
    Integer,
    String,
    Text,
    Date,
    DateTime,
    ForeignKey,
    CheckConstraint,
    UniqueConstraint,
    Index,
    func,
)
from sqlalchemy.orm import declarative_base, sessionmaker
from datetime import date, datetime, timezone
import os

database_url = os.getenv("DATABASE_PATH", "sqlite:///outputs/databases/clinic_appointments_1.db")

engine = create_engine(database_url, connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(bind=engine, autoflush=False, autocommit=False)

Base = declarative_base()

CURRENT_PATIENT_ID = 1
SLOT_TYPES = ("in_person", "video")


class Patient(Base):
    __tablename__ = "patients"
    id = Column(Integer, primary_key=True)
    full_name = Column(String, nullable=False)
    date_of_birth = Column(Date, nullable=False)
    email = Column(String, nullable=False, unique=True)
    phone = Column(String)
    insurance_provider = Column(String)
    insurance_member_id = Column(String)
    created_at = Column(DateTime, server_default=func.current_timestamp())
    updated_at = Column(DateTime, server_default=func.current_timestamp())


class Doctor(Base):
    __tablename__ = "doctors"
    __table_args__ = (CheckConstraint("accepting_new_patients IN (0, 1)", name="ck_doctors_accepting"),)
    id = Column(Integer, primary_key=True)
    full_name = Column(String, nullable=False)
    specialty = Column(String, nullable=False)
    office_location = Column(String)
    phone = Column(String)
    accepting_new_patients = Column(Integer, nullable=False, default=1)
    created_at = Column(DateTime, server_default=func.current_timestamp())


class Pharmacy(Base):
    __tablename__ = "pharmacies"
    __table_args__ = (CheckConstraint("open_24_hours IN (0, 1)", name="ck_pharmacies_24h"),)
    id = Column(Integer, primary_key=True)
    name = Column(String, nullable=False, unique=True)
    address = Column(String, nullable=False)
    phone = Column(String)
    open_24_hours = Column(Integer, nullable=False, default=0)


class TimeSlot(Base):
    __tablename__ = "time_slots"
    __table_args__ = (
        CheckConstraint("slot_type IN ('in_person', 'video')", name="ck_time_slots_type"),
        CheckConstraint("status IN ('open', 'booked', 'blocked')", name="ck_time_slots_status"),
        CheckConstraint("end_time > start_time", name="ck_time_slots_order"),
        UniqueConstraint("doctor_id", "start_time", name="uq_time_slots_doctor_start"),
    )
    id = Column(Integer, primary_key=True)
    doctor_id = Column(Integer, ForeignKey("doctors.id"), nullable=False)
    start_time = Column(DateTime, nullable=False)
    end_time = Column(DateTime, nullable=False)
    slot_type = Column(String, nullable=False)
    status = Column(String, nullable=False, default="open")


class Appointment(Base):
    __tablename__ = "appointments"
    __table_args__ = (
        CheckConstraint("visit_type IN ('in_person', 'video')", name="ck_appointments_visit_type"),
        CheckConstraint(
            "status IN ('scheduled', 'completed', 'cancelled', 'no_show')", name="ck_appointments_status"
        ),
    )
    id = Column(Integer, primary_key=True)
    patient_id = Column(Integer, ForeignKey("patients.id"), nullable=False)
    doctor_id = Column(Integer, ForeignKey("doctors.id"), nullable=False)
    slot_id = Column(Integer, ForeignKey("time_slots.id"), nullable=False)
    reason = Column(Text, nullable=False)
    visit_type = Column(String, nullable=False)
    status = Column(String, nullable=False, default="scheduled")
    notes = Column(Text)
    created_at = Column(DateTime, server_default=func.current_timestamp())
    updated_at = Column(DateTime, server_default=func.current_timestamp())
    cancelled_at = Column(DateTime)


class Prescription(Base):
    __tablename__ = "prescriptions"
    __table_args__ = (
        CheckConstraint("refills_remaining >= 0", name="ck_prescriptions_refills"),
        CheckConstraint("status IN ('active', 'expired', 'discontinued')", name="ck_prescriptions_status"),
    )
    id = Column(Integer, primary_key=True)
    patient_id = Column(Integer, ForeignKey("patients.id"), nullable=False)
    doctor_id = Column(Integer, ForeignKey("doctors.id"), nullable=False)
    pharmacy_id = Column(Integer, ForeignKey("pharmacies.id"))
    medication_name = Column(String, nullable=False)
    dosage = Column(String, nullable=False)
    instructions = Column(Text)
    refills_remaining = Column(Integer, nullable=False, default=0)
    status = Column(String, nullable=False, default="active")
    prescribed_at = Column(DateTime, server_default=func.current_timestamp())
    expires_at = Column(DateTime)


class RefillRequest(Base):
    __tablename__ = "refill_requests"
    __table_args__ = (
        CheckConstraint(
            "status IN ('pending', 'approved', 'denied', 'withdrawn')", name="ck_refill_requests_status"
        ),
    )
    id = Column(Integer, primary_key=True)
    prescription_id = Column(Integer, ForeignKey("prescriptions.id"), nullable=False)
    pharmacy_id = Column(Integer, ForeignKey("pharmacies.id"), nullable=False)
    status = Column(String, nullable=False, default="pending")
    note = Column(Text)
    requested_at = Column(DateTime, server_default=func.current_timestamp())
    resolved_at = Column(DateTime)


class Message(Base):
    __tablename__ = "messages"
    __table_args__ = (
        CheckConstraint("direction IN ('to_doctor', 'from_doctor')", name="ck_messages_direction"),
        CheckConstraint("is_read IN (0, 1)", name="ck_messages_is_read"),
    )
    id = Column(Integer, primary_key=True)
    patient_id = Column(Integer, ForeignKey("patients.id"), nullable=False)
    doctor_id = Column(Integer, ForeignKey("doctors.id"), nullable=False)
    direction = Column(String, nullable=False)
    subject = Column(String, nullable=False)
    body = Column(Text, nullable=False)
    is_read = Column(Integer, nullable=False, default=0)
    sent_at = Column(DateTime, server_default=func.current_timestamp())


Index("idx_doctors_specialty", Doctor.specialty)
Index("idx_doctors_full_name", Doctor.full_name)
Index("idx_time_slots_doctor_start", TimeSlot.doctor_id, TimeSlot.start_time)
Index("idx_time_slots_status", TimeSlot.status)
Index("idx_appointments_patient_status", Appointment.patient_id, Appointment.status)
Index("idx_appointments_slot_id", Appointment.slot_id)
Index("idx_prescriptions_patient_status", Prescription.patient_id, Prescription.status)
Index("idx_prescriptions_medication", Prescription.medication_name)
Index("idx_refill_requests_prescription_status", RefillRequest.prescription_id, RefillRequest.status)
Index("idx_messages_patient_sent", Message.patient_id, Message.sent_at)

Base.metadata.create_all(engine)

app = FastAPI(
    title="Lakeside Family Clinic Patient Portal API",
    version="1.0.0",
    description="Appointments, prescriptions, refills and secure messages for a logged-in clinic patient.",
)


def utc_now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


# ---------------------------------------------------------------------------
# Pydantic models
# ---------------------------------------------------------------------------


class DoctorModel(BaseModel):
    id: int = Field(..., description="Doctor ID.", examples=[3])
    full_name: str = Field(..., description="Doctor's name (without the Dr. title).", examples=["Lena Fischer"])
    specialty: str = Field(..., description="Medical specialty.", examples=["Dermatology"])
    office_location: Optional[str] = Field(None, description="Office room.", examples=["Suite 318"])
    phone: Optional[str] = Field(None, description="Office phone.", examples=["555-0303"])
    accepting_new_patients: bool = Field(..., description="Whether the doctor takes new patients.", examples=[True])


class DoctorListResponse(BaseModel):
    doctors: List[DoctorModel] = Field(..., description="Matching doctors.")
    count: int = Field(..., description="Number of doctors returned.", examples=[1])


class SlotModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Time slot ID (use it to book).", examples=[9])
    doctor_id: int = Field(..., description="Doctor ID.", examples=[3])
    start_time: datetime = Field(..., description="Slot start (UTC).")
    end_time: datetime = Field(..., description="Slot end (UTC).")
    slot_type: str = Field(..., description="in_person or video.", examples=["in_person"])
    status: str = Field(..., description="open, booked or blocked.", examples=["open"])


class SlotListResponse(BaseModel):
    doctor_id: int = Field(..., description="Doctor ID.", examples=[3])
    doctor_name: str = Field(..., description="Doctor name.", examples=["Lena Fischer"])
    slots: List[SlotModel] = Field(..., description="Slots ordered by start time.")
    count: int = Field(..., description="Number of slots returned.", examples=[5])


class PatientModel(BaseModel):
    id: int = Field(..., description="Patient ID.", examples=[1])
    full_name: str = Field(..., description="Patient name.", examples=["Maya Thompson"])
    date_of_birth: date = Field(..., description="Date of birth.")
    email: str = Field(..., description="Contact email.", examples=["maya.thompson@example.com"])
    phone: Optional[str] = Field(None, description="Contact phone.", examples=["555-201-7788"])
    insurance_provider: Optional[str] = Field(None, description="Insurance company.", examples=["Northstar Mutual"])
    insurance_member_id: Optional[str] = Field(None, description="Insurance member number.")
    scheduled_appointments: int = Field(..., description="Number of scheduled appointments.", examples=[3])
    active_prescriptions: int = Field(..., description="Number of active prescriptions.", examples=[4])
    unread_messages: int = Field(..., description="Unread messages from doctors.", examples=[2])
    updated_at: Optional[datetime] = Field(None, description="Last profile change (UTC).")


class PatientUpdateBody(BaseModel):
    email: Optional[str] = Field(None, description="New contact email.")
    phone: Optional[str] = Field(None, description="New contact phone.", examples=["555-014-2233"])
    insurance_provider: Optional[str] = Field(None, description="New insurance company.", examples=["Blue Harbor Health"])
    insurance_member_id: Optional[str] = Field(None, description="New insurance member number.")


class AppointmentModel(BaseModel):
    id: int = Field(..., description="Appointment ID.", examples=[3])
    doctor_id: int = Field(..., description="Doctor ID.", examples=[4])
    doctor_name: str = Field(..., description="Doctor name.", examples=["Samuel Park"])
    specialty: str = Field(..., description="Doctor specialty.", examples=["Orthopedics"])
    slot_id: int = Field(..., description="Booked time slot ID.", examples=[15])
    start_time: datetime = Field(..., description="Appointment start (UTC).")
    end_time: datetime = Field(..., description="Appointment end (UTC).")
    visit_type: str = Field(..., description="in_person or video.", examples=["in_person"])
    reason: str = Field(..., description="Reason for the visit.", examples=["knee follow-up"])
    status: str = Field(..., description="scheduled, completed, cancelled or no_show.", examples=["scheduled"])
    notes: Optional[str] = Field(None, description="Patient notes for the visit.")
    created_at: Optional[datetime] = Field(None, description="Booking time (UTC).")
    cancelled_at: Optional[datetime] = Field(None, description="Cancellation time (UTC).")


class AppointmentListResponse(BaseModel):
    appointments: List[AppointmentModel] = Field(..., description="Appointments ordered by start time.")
    count: int = Field(..., description="Number of appointments returned.", examples=[4])


class AppointmentResponse(BaseModel):
    appointment: AppointmentModel = Field(..., description="The appointment after the operation.")
    message: str = Field(..., description="Human readable result.", examples=["Appointment booked."])


class AppointmentCreateBody(BaseModel):
    slot_id: int = Field(..., description="ID of an open time slot.", examples=[9])
    reason: str = Field(..., description="Reason for the visit.", examples=["mole check"])
    notes: Optional[str] = Field(None, description="Optional notes for the doctor.")


class AppointmentRescheduleBody(BaseModel):
    new_slot_id: int = Field(..., description="ID of an open slot of the same doctor.", examples=[2])


class AppointmentUpdateBody(BaseModel):
    reason: Optional[str] = Field(None, description="New reason for the visit.")
    notes: Optional[str] = Field(None, description="New notes for the doctor.")


class PrescriptionModel(BaseModel):
    id: int = Field(..., description="Prescription ID.", examples=[5])
    medication_name: str = Field(..., description="Medication.", examples=["Metformin"])
    dosage: str = Field(..., description="Strength.", examples=["500 mg"])
    instructions: Optional[str] = Field(None, description="How to take it.", examples=["twice daily with meals"])
    refills_remaining: int = Field(..., description="Refills left.", examples=[5])
    status: str = Field(..., description="active, expired or discontinued.", examples=["active"])
    doctor_id: int = Field(..., description="Prescribing doctor ID.", examples=[1])
    doctor_name: str = Field(..., description="Prescribing doctor name.", examples=["Amara Okoye"])
    pharmacy_id: Optional[int] = Field(None, description="Default pharmacy ID.", examples=[1])
    pharmacy_name: Optional[str] = Field(None, description="Default pharmacy name.", examples=["Maple Street Pharmacy"])
    prescribed_at: Optional[datetime] = Field(None, description="Prescription date (UTC).")
    expires_at: Optional[datetime] = Field(None, description="Expiry date (UTC).")


class PrescriptionListResponse(BaseModel):
    prescriptions: List[PrescriptionModel] = Field(..., description="Prescriptions of the patient.")
    count: int = Field(..., description="Number returned.", examples=[4])


class PharmacyModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Pharmacy ID.", examples=[2])
    name: str = Field(..., description="Pharmacy name.", examples=["Harbor View Pharmacy"])
    address: str = Field(..., description="Street address.")
    phone: Optional[str] = Field(None, description="Phone number.")
    open_24_hours: bool = Field(..., description="Open around the clock.", examples=[False])


class PharmacyListResponse(BaseModel):
    pharmacies: List[PharmacyModel] = Field(..., description="Matching pharmacies.")
    count: int = Field(..., description="Number returned.", examples=[4])


class RefillRequestModel(BaseModel):
    id: int = Field(..., description="Refill request ID.", examples=[1])
    prescription_id: int = Field(..., description="Prescription ID.", examples=[1])
    medication_name: str = Field(..., description="Medication.", examples=["Lisinopril"])
    dosage: str = Field(..., description="Strength.", examples=["10 mg"])
    pharmacy_id: int = Field(..., description="Pharmacy that fills the refill.", examples=[1])
    pharmacy_name: str = Field(..., description="Pharmacy name.", examples=["Maple Street Pharmacy"])
    status: str = Field(..., description="pending, approved, denied or withdrawn.", examples=["pending"])
    note: Optional[str] = Field(None, description="Patient note.")
    requested_at: Optional[datetime] = Field(None, description="Request time (UTC).")
    resolved_at: Optional[datetime] = Field(None, description="Approval or denial time (UTC).")


class RefillRequestListResponse(BaseModel):
    refill_requests: List[RefillRequestModel] = Field(..., description="Refill requests, newest first.")
    count: int = Field(..., description="Number returned.", examples=[2])


class RefillRequestResponse(BaseModel):
    refill_request: RefillRequestModel = Field(..., description="The request after the operation.")
    message: str = Field(..., description="Human readable result.", examples=["Refill requested."])


class RefillCreateBody(BaseModel):
    pharmacy_id: Optional[int] = Field(
        None, description="Pharmacy to send the refill to; defaults to the prescription's pharmacy.", examples=[2]
    )
    note: Optional[str] = Field(None, description="Optional note for the care team.")


class MessageModel(BaseModel):
    id: int = Field(..., description="Message ID.", examples=[3])
    doctor_id: int = Field(..., description="Doctor on the other side.", examples=[4])
    doctor_name: str = Field(..., description="Doctor name.", examples=["Samuel Park"])
    direction: str = Field(..., description="to_doctor (sent by me) or from_doctor.", examples=["from_doctor"])
    subject: str = Field(..., description="Subject line.", examples=["Knee exercises"])
    body: str = Field(..., description="Message text.")
    is_read: bool = Field(..., description="Whether the message has been read.", examples=[False])
    sent_at: Optional[datetime] = Field(None, description="Send time (UTC).")


class MessageListResponse(BaseModel):
    messages: List[MessageModel] = Field(..., description="Messages, newest first.")
    count: int = Field(..., description="Number returned.", examples=[5])


class MessageResponse(BaseModel):
    message: MessageModel = Field(..., description="The sent message.")


class MessageCreateBody(BaseModel):
    doctor_id: int = Field(..., description="Recipient doctor ID.", examples=[1])
    subject: str = Field(..., description="Subject line.", examples=["Blood pressure readings"])
    body: str = Field(..., description="Message text.", examples=["My readings this week averaged 128/82."])


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def doctor_model(doc: Doctor) -> DoctorModel:
    return DoctorModel(
        id=doc.id,
        full_name=doc.full_name,
        specialty=doc.specialty,
        office_location=doc.office_location,
        phone=doc.phone,
        accepting_new_patients=bool(doc.accepting_new_patients),
    )


def appointment_model(session, appt: Appointment) -> AppointmentModel:
    doc = session.query(Doctor).filter(Doctor.id == appt.doctor_id).first()
    slot = session.query(TimeSlot).filter(TimeSlot.id == appt.slot_id).first()
    return AppointmentModel(
        id=appt.id,
        doctor_id=appt.doctor_id,
        doctor_name=doc.full_name if doc else "",
        specialty=doc.specialty if doc else "",
        slot_id=appt.slot_id,
        start_time=slot.start_time,
        end_time=slot.end_time,
        visit_type=appt.visit_type,
        reason=appt.reason,
        status=appt.status,
        notes=appt.notes,
        created_at=appt.created_at,
        cancelled_at=appt.cancelled_at,
    )


def prescription_model(session, rx: Prescription) -> PrescriptionModel:
    doc = session.query(Doctor).filter(Doctor.id == rx.doctor_id).first()
    pharmacy = None
    if rx.pharmacy_id is not None:
        pharmacy = session.query(Pharmacy).filter(Pharmacy.id == rx.pharmacy_id).first()
    return PrescriptionModel(
        id=rx.id,
        medication_name=rx.medication_name,
        dosage=rx.dosage,
        instructions=rx.instructions,
        refills_remaining=rx.refills_remaining,
        status=rx.status,
        doctor_id=rx.doctor_id,
        doctor_name=doc.full_name if doc else "",
        pharmacy_id=rx.pharmacy_id,
        pharmacy_name=pharmacy.name if pharmacy else None,
        prescribed_at=rx.prescribed_at,
        expires_at=rx.expires_at,
    )


def refill_model(session, req: RefillRequest) -> RefillRequestModel:
    rx = session.query(Prescription).filter(Prescription.id == req.prescription_id).first()
    pharmacy = session.query(Pharmacy).filter(Pharmacy.id == req.pharmacy_id).first()
    return RefillRequestModel(
        id=req.id,
        prescription_id=req.prescription_id,
        medication_name=rx.medication_name if rx else "",
        dosage=rx.dosage if rx else "",
        pharmacy_id=req.pharmacy_id,
        pharmacy_name=pharmacy.name if pharmacy else "",
        status=req.status,
        note=req.note,
        requested_at=req.requested_at,
        resolved_at=req.resolved_at,
    )


def message_model(session, msg: Message) -> MessageModel:
    doc = session.query(Doctor).filter(Doctor.id == msg.doctor_id).first()
    return MessageModel(
        id=msg.id,
        doctor_id=msg.doctor_id,
        doctor_name=doc.full_name if doc else "",
        direction=msg.direction,
        subject=msg.subject,
        body=msg.body,
        is_read=bool(msg.is_read),
        sent_at=msg.sent_at,
    )


def get_own_appointment(session, appointment_id: int) -> Appointment:
    appt = (
        session.query(Appointment)
        .filter(Appointment.id == appointment_id, Appointment.patient_id == CURRENT_PATIENT_ID)
        .first()
    )
    if appt is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Appointment {appointment_id} not found.")
    return appt


# ---------------------------------------------------------------------------
# Doctors and slots
# ---------------------------------------------------------------------------


@app.get(
    "/api/doctors",
    response_model=DoctorListResponse,
    summary="Search doctors",
    description="Find clinic doctors by a partial, case-insensitive name match and/or specialty.",
    tags=["doctors"],
    operation_id="search_doctors",
)
async def search_doctors(
    name: Optional[str] = Query(None, description="Part of the doctor's name.", examples=["Fischer"]),
    specialty: Optional[str] = Query(None, description="Part of the specialty name.", examples=["Dermatology"]),
    accepting_new_patients: Optional[bool] = Query(None, description="Only doctors that accept (or not) new patients."),
) -> DoctorListResponse:
    session = SessionLocal()
    q = session.query(Doctor)
    if name:
        term = name.strip()
        for prefix in ("dr. ", "dr "):
            if term.lower().startswith(prefix):
                term = term[len(prefix):].strip()
        q = q.filter(Doctor.full_name.ilike(f"%{term}%"))
    if specialty:
        q = q.filter(Doctor.specialty.ilike(f"%{specialty.strip()}%"))
    if accepting_new_patients is not None:
        q = q.filter(Doctor.accepting_new_patients == (1 if accepting_new_patients else 0))
    doctors = [doctor_model(d) for d in q.order_by(Doctor.full_name.asc()).all()]
    session.close()
    return DoctorListResponse(doctors=doctors, count=len(doctors))


@app.get(
    "/api/doctors/{doctor_id}/slots",
    response_model=SlotListResponse,
    summary="List a doctor's time slots",
    description="Return a doctor's appointment slots ordered by start time, optionally filtered by status "
    "(open, booked, blocked), visit type (in_person, video) and calendar date (YYYY-MM-DD).",
    tags=["doctors", "appointments"],
    operation_id="list_doctor_slots",
)
async def list_doctor_slots(
    doctor_id: int = Path(..., description="Doctor ID.", examples=[3]),
    status: Optional[str] = Query(None, description="Slot status filter: open, booked or blocked.", examples=["open"]),
    slot_type: Optional[str] = Query(None, description="Visit type filter: in_person or video.", examples=["video"]),
    on_date: Optional[str] = Query(None, description="Only slots starting on this date (YYYY-MM-DD)."),
) -> SlotListResponse:
    session = SessionLocal()
    doc = session.query(Doctor).filter(Doctor.id == doctor_id).first()
    if doc is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Doctor {doctor_id} not found.")
    q = session.query(TimeSlot).filter(TimeSlot.doctor_id == doctor_id)
    if status:
        q = q.filter(TimeSlot.status == status.strip().lower())
    if slot_type:
        kind = slot_type.strip().lower().replace("-", "_").replace(" ", "_")
        if kind not in SLOT_TYPES:
            session.close()
            raise HTTPException(status_code=400, detail="slot_type must be in_person or video.")
        q = q.filter(TimeSlot.slot_type == kind)
    if on_date:
        try:
            day = date.fromisoformat(on_date.strip())
        except ValueError:
            session.close()
            raise HTTPException(status_code=400, detail="on_date must look like YYYY-MM-DD.")
        q = q.filter(func.date(TimeSlot.start_time) == day.isoformat())
    slots = [SlotModel.model_validate(s) for s in q.order_by(TimeSlot.start_time.asc(), TimeSlot.id.asc()).all()]
    result = SlotListResponse(doctor_id=doc.id, doctor_name=doc.full_name, slots=slots, count=len(slots))
    session.close()
    return result


# ---------------------------------------------------------------------------
# Profile
# ---------------------------------------------------------------------------


def patient_model(session, p: Patient) -> PatientModel:
    scheduled = (
        session.query(func.count(Appointment.id))
        .filter(Appointment.patient_id == p.id, Appointment.status == "scheduled")
        .scalar()
        or 0
    )
    active_rx = (
        session.query(func.count(Prescription.id))
        .filter(Prescription.patient_id == p.id, Prescription.status == "active")
        .scalar()
        or 0
    )
    unread = (
        session.query(func.count(Message.id))
        .filter(Message.patient_id == p.id, Message.direction == "from_doctor", Message.is_read == 0)
        .scalar()
        or 0
    )
    return PatientModel(
        id=p.id,
        full_name=p.full_name,
        date_of_birth=p.date_of_birth,
        email=p.email,
        phone=p.phone,
        insurance_provider=p.insurance_provider,
        insurance_member_id=p.insurance_member_id,
        scheduled_appointments=scheduled,
        active_prescriptions=active_rx,
        unread_messages=unread,
        updated_at=p.updated_at,
    )


@app.get(
    "/api/patients/me",
    response_model=PatientModel,
    summary="Get my patient profile",
    description="Return the logged-in patient's contact and insurance details with counts of scheduled "
    "appointments, active prescriptions and unread messages.",
    tags=["profile"],
    operation_id="get_my_profile",
)
async def get_my_profile() -> PatientModel:
    session = SessionLocal()
    p = session.query(Patient).filter(Patient.id == CURRENT_PATIENT_ID).first()
    if p is None:
        session.close()
        raise HTTPException(status_code=404, detail="Current patient not found.")
    result = patient_model(session, p)
    session.close()
    return result


@app.patch(
    "/api/patients/me",
    response_model=PatientModel,
    summary="Update my patient profile",
    description="Change the logged-in patient's email, phone or insurance details. Fields left out stay unchanged.",
    tags=["profile"],
    operation_id="update_my_profile",
)
async def update_my_profile(
    body: PatientUpdateBody = Body(..., description="Fields to change."),
) -> PatientModel:
    session = SessionLocal()
    p = session.query(Patient).filter(Patient.id == CURRENT_PATIENT_ID).first()
    if p is None:
        session.close()
        raise HTTPException(status_code=404, detail="Current patient not found.")
    if body.email is not None:
        email = body.email.strip()
        if "@" not in email:
            session.close()
            raise HTTPException(status_code=400, detail="email must be a valid address.")
        taken = session.query(Patient).filter(Patient.email == email, Patient.id != p.id).first()
        if taken is not None:
            session.close()
            raise HTTPException(status_code=409, detail="That email belongs to another patient.")
        p.email = email
    if body.phone is not None:
        digits = [ch for ch in body.phone if ch.isdigit()]
        if len(digits) < 7:
            session.close()
            raise HTTPException(status_code=400, detail="phone must contain at least 7 digits.")
        p.phone = body.phone.strip()
    if body.insurance_provider is not None:
        p.insurance_provider = body.insurance_provider.strip()
    if body.insurance_member_id is not None:
        p.insurance_member_id = body.insurance_member_id.strip()
    p.updated_at = utc_now()
    session.commit()
    result = patient_model(session, p)
    session.close()
    return result


# ---------------------------------------------------------------------------
# Appointments
# ---------------------------------------------------------------------------


@app.get(
    "/api/appointments",
    response_model=AppointmentListResponse,
    summary="List my appointments",
    description="Return the logged-in patient's appointments ordered by start time, optionally filtered by status "
    "or doctor.",
    tags=["appointments"],
    operation_id="list_my_appointments",
)
async def list_my_appointments(
    status: Optional[str] = Query(None, description="scheduled, completed, cancelled or no_show.", examples=["scheduled"]),
    doctor_id: Optional[int] = Query(None, description="Only appointments with this doctor."),
) -> AppointmentListResponse:
    session = SessionLocal()
    q = (
        session.query(Appointment)
        .join(TimeSlot, Appointment.slot_id == TimeSlot.id)
        .filter(Appointment.patient_id == CURRENT_PATIENT_ID)
    )
    if status:
        q = q.filter(Appointment.status == status.strip().lower())
    if doctor_id is not None:
        q = q.filter(Appointment.doctor_id == doctor_id)
    appts = q.order_by(TimeSlot.start_time.asc(), Appointment.id.asc()).all()
    result = [appointment_model(session, a) for a in appts]
    session.close()
    return AppointmentListResponse(appointments=result, count=len(result))


@app.post(
    "/api/appointments",
    response_model=AppointmentResponse,
    summary="Book an appointment",
    description="Book an open time slot. The visit type (in_person or video) comes from the slot. Fails with 409 "
    "when the slot is not open, or when the doctor takes no new patients and I have never seen them.",
    tags=["appointments"],
    operation_id="book_appointment",
)
async def book_appointment(
    body: AppointmentCreateBody = Body(..., description="Slot and reason."),
) -> AppointmentResponse:
    session = SessionLocal()
    slot = session.query(TimeSlot).filter(TimeSlot.id == body.slot_id).first()
    if slot is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Time slot {body.slot_id} not found.")
    if not body.reason.strip():
        session.close()
        raise HTTPException(status_code=400, detail="reason must not be empty.")
    if slot.status != "open":
        session.close()
        raise HTTPException(status_code=409, detail=f"Time slot {slot.id} is {slot.status}.")
    doc = session.query(Doctor).filter(Doctor.id == slot.doctor_id).first()
    if not doc.accepting_new_patients:
        seen = (
            session.query(Appointment)
            .filter(Appointment.patient_id == CURRENT_PATIENT_ID, Appointment.doctor_id == doc.id)
            .first()
        )
        if seen is None:
            session.close()
            raise HTTPException(status_code=409, detail="This doctor is not accepting new patients.")
    now = utc_now()
    appt = Appointment(
        patient_id=CURRENT_PATIENT_ID,
        doctor_id=doc.id,
        slot_id=slot.id,
        reason=body.reason.strip(),
        visit_type=slot.slot_type,
        status="scheduled",
        notes=body.notes,
        created_at=now,
        updated_at=now,
    )
    slot.status = "booked"
    session.add(appt)
    session.commit()
    result = appointment_model(session, appt)
    session.close()
    return AppointmentResponse(appointment=result, message="Appointment booked.")


@app.put(
    "/api/appointments/{appointment_id}/reschedule",
    response_model=AppointmentResponse,
    summary="Reschedule an appointment",
    description="Move one of my scheduled appointments to another open slot of the same doctor. The appointment "
    "keeps its ID and reason; its visit type follows the new slot and the old slot is released.",
    tags=["appointments"],
    operation_id="reschedule_appointment",
)
async def reschedule_appointment(
    appointment_id: int = Path(..., description="Appointment ID.", examples=[1]),
    body: AppointmentRescheduleBody = Body(..., description="Target slot."),
) -> AppointmentResponse:
    session = SessionLocal()
    appt = get_own_appointment(session, appointment_id)
    if appt.status != "scheduled":
        session.close()
        raise HTTPException(status_code=409, detail=f"Appointment is {appt.status}.")
    new_slot = session.query(TimeSlot).filter(TimeSlot.id == body.new_slot_id).first()
    if new_slot is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Time slot {body.new_slot_id} not found.")
    if new_slot.doctor_id != appt.doctor_id:
        session.close()
        raise HTTPException(status_code=400, detail="The new slot belongs to a different doctor; book a new appointment.")
    if new_slot.id == appt.slot_id:
        session.close()
        raise HTTPException(status_code=409, detail="The appointment is already in that slot.")
    if new_slot.status != "open":
        session.close()
        raise HTTPException(status_code=409, detail=f"Time slot {new_slot.id} is {new_slot.status}.")
    old_slot = session.query(TimeSlot).filter(TimeSlot.id == appt.slot_id).first()
    if old_slot is not None:
        old_slot.status = "open"
    new_slot.status = "booked"
    appt.slot_id = new_slot.id
    appt.visit_type = new_slot.slot_type
    appt.updated_at = utc_now()
    session.commit()
    result = appointment_model(session, appt)
    session.close()
    return AppointmentResponse(appointment=result, message="Appointment rescheduled.")


@app.patch(
    "/api/appointments/{appointment_id}",
    response_model=AppointmentResponse,
    summary="Edit appointment details",
    description="Change the reason or notes of one of my scheduled appointments without moving it.",
    tags=["appointments"],
    operation_id="update_appointment_details",
)
async def update_appointment_details(
    appointment_id: int = Path(..., description="Appointment ID.", examples=[4]),
    body: AppointmentUpdateBody = Body(..., description="Fields to change."),
) -> AppointmentResponse:
    session = SessionLocal()
    appt = get_own_appointment(session, appointment_id)
    if appt.status != "scheduled":
        session.close()
        raise HTTPException(status_code=409, detail=f"Appointment is {appt.status}.")
    if body.reason is not None:
        if not body.reason.strip():
            session.close()
            raise HTTPException(status_code=400, detail="reason must not be empty.")
        appt.reason = body.reason.strip()
    if body.notes is not None:
        appt.notes = body.notes
    appt.updated_at = utc_now()
    session.commit()
    result = appointment_model(session, appt)
    session.close()
    return AppointmentResponse(appointment=result, message="Appointment updated.")


@app.delete(
    "/api/appointments/{appointment_id}",
    response_model=AppointmentResponse,
    summary="Cancel an appointment",
    description="Cancel one of my scheduled appointments and release its time slot. The appointment stays in my "
    "history with status cancelled.",
    tags=["appointments"],
    operation_id="cancel_appointment",
)
async def cancel_appointment(
    appointment_id: int = Path(..., description="Appointment ID.", examples=[3]),
) -> AppointmentResponse:
    session = SessionLocal()
    appt = get_own_appointment(session, appointment_id)
    if appt.status != "scheduled":
        session.close()
        raise HTTPException(status_code=409, detail=f"Appointment is already {appt.status}.")
    slot = session.query(TimeSlot).filter(TimeSlot.id == appt.slot_id).first()
    if slot is not None:
        slot.status = "open"
    now = utc_now()
    appt.status = "cancelled"
    appt.cancelled_at = now
    appt.updated_at = now
    session.commit()
    result = appointment_model(session, appt)
    session.close()
    return AppointmentResponse(appointment=result, message="Appointment cancelled.")


# ---------------------------------------------------------------------------
# Prescriptions, pharmacies and refills
# ---------------------------------------------------------------------------


@app.get(
    "/api/prescriptions",
    response_model=PrescriptionListResponse,
    summary="List my prescriptions",
    description="Return the logged-in patient's prescriptions with prescriber, default pharmacy and refills left. "
    "Filter by status (active, expired, discontinued) or by part of the medication name.",
    tags=["prescriptions"],
    operation_id="list_my_prescriptions",
)
async def list_my_prescriptions(
    status: Optional[str] = Query(None, description="active, expired or discontinued.", examples=["active"]),
    medication: Optional[str] = Query(None, description="Part of the medication name.", examples=["Metformin"]),
) -> PrescriptionListResponse:
    session = SessionLocal()
    q = session.query(Prescription).filter(Prescription.patient_id == CURRENT_PATIENT_ID)
    if status:
        q = q.filter(Prescription.status == status.strip().lower())
    if medication:
        q = q.filter(Prescription.medication_name.ilike(f"%{medication.strip()}%"))
    rxs = q.order_by(Prescription.prescribed_at.desc(), Prescription.id.desc()).all()
    result = [prescription_model(session, rx) for rx in rxs]
    session.close()
    return PrescriptionListResponse(prescriptions=result, count=len(result))


@app.get(
    "/api/pharmacies",
    response_model=PharmacyListResponse,
    summary="List pharmacies",
    description="Return the pharmacies the clinic can send prescriptions to, optionally filtered by name.",
    tags=["prescriptions"],
    operation_id="list_pharmacies",
)
async def list_pharmacies(
    query: Optional[str] = Query(None, description="Part of the pharmacy name.", examples=["Harbor"]),
) -> PharmacyListResponse:
    session = SessionLocal()
    q = session.query(Pharmacy)
    if query:
        q = q.filter(Pharmacy.name.ilike(f"%{query.strip()}%"))
    rows = q.order_by(Pharmacy.name.asc()).all()
    result = [
        PharmacyModel(id=p.id, name=p.name, address=p.address, phone=p.phone, open_24_hours=bool(p.open_24_hours))
        for p in rows
    ]
    session.close()
    return PharmacyListResponse(pharmacies=result, count=len(result))


@app.post(
    "/api/prescriptions/{prescription_id}/refills",
    response_model=RefillRequestResponse,
    summary="Request a refill",
    description="Ask for a refill of one of my active prescriptions. The refill goes to the given pharmacy, or to "
    "the prescription's default pharmacy when none is given. Fails with 409 when no refills are left or an "
    "identical request is already pending.",
    tags=["prescriptions"],
    operation_id="request_refill",
)
async def request_refill(
    prescription_id: int = Path(..., description="Prescription ID.", examples=[5]),
    body: RefillCreateBody = Body(..., description="Pharmacy and note."),
) -> RefillRequestResponse:
    session = SessionLocal()
    rx = (
        session.query(Prescription)
        .filter(Prescription.id == prescription_id, Prescription.patient_id == CURRENT_PATIENT_ID)
        .first()
    )
    if rx is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Prescription {prescription_id} not found.")
    if rx.status != "active":
        session.close()
        raise HTTPException(status_code=409, detail=f"Prescription is {rx.status}; ask your doctor for a new one.")
    if rx.refills_remaining <= 0:
        session.close()
        raise HTTPException(status_code=409, detail="No refills remaining on this prescription.")
    pharmacy_id = body.pharmacy_id if body.pharmacy_id is not None else rx.pharmacy_id
    pharmacy = session.query(Pharmacy).filter(Pharmacy.id == pharmacy_id).first() if pharmacy_id else None
    if pharmacy is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Pharmacy {pharmacy_id} not found.")
    duplicate = (
        session.query(RefillRequest)
        .filter(
            RefillRequest.prescription_id == rx.id,
            RefillRequest.pharmacy_id == pharmacy.id,
            RefillRequest.status == "pending",
        )
        .first()
    )
    if duplicate is not None:
        session.close()
        raise HTTPException(status_code=409, detail=f"Refill request {duplicate.id} is already pending there.")
    req = RefillRequest(
        prescription_id=rx.id,
        pharmacy_id=pharmacy.id,
        status="pending",
        note=body.note,
        requested_at=utc_now(),
        resolved_at=None,
    )
    session.add(req)
    session.commit()
    result = refill_model(session, req)
    session.close()
    return RefillRequestResponse(refill_request=result, message=f"Refill requested at {pharmacy.name}.")


@app.get(
    "/api/refill-requests",
    response_model=RefillRequestListResponse,
    summary="List my refill requests",
    description="Return refill requests for my prescriptions, newest first, optionally filtered by status "
    "(pending, approved, denied, withdrawn).",
    tags=["prescriptions"],
    operation_id="list_my_refill_requests",
)
async def list_my_refill_requests(
    status: Optional[str] = Query(None, description="pending, approved, denied or withdrawn.", examples=["pending"]),
) -> RefillRequestListResponse:
    session = SessionLocal()
    q = (
        session.query(RefillRequest)
        .join(Prescription, RefillRequest.prescription_id == Prescription.id)
        .filter(Prescription.patient_id == CURRENT_PATIENT_ID)
    )
    if status:
        q = q.filter(RefillRequest.status == status.strip().lower())
    reqs = q.order_by(RefillRequest.requested_at.desc(), RefillRequest.id.desc()).all()
    result = [refill_model(session, r) for r in reqs]
    session.close()
    return RefillRequestListResponse(refill_requests=result, count=len(result))


@app.delete(
    "/api/refill-requests/{request_id}",
    response_model=RefillRequestResponse,
    summary="Withdraw a refill request",
    description="Withdraw one of my pending refill requests. It stays in the history with status withdrawn.",
    tags=["prescriptions"],
    operation_id="withdraw_refill_request",
)
async def withdraw_refill_request(
    request_id: int = Path(..., description="Refill request ID.", examples=[1]),
) -> RefillRequestResponse:
    session = SessionLocal()
    req = (
        session.query(RefillRequest)
        .join(Prescription, RefillRequest.prescription_id == Prescription.id)
        .filter(RefillRequest.id == request_id, Prescription.patient_id == CURRENT_PATIENT_ID)
        .first()
    )
    if req is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Refill request {request_id} not found.")
    if req.status != "pending":
        session.close()
        raise HTTPException(status_code=409, detail=f"Refill request is already {req.status}.")
    req.status = "withdrawn"
    req.resolved_at = utc_now()
    session.commit()
    result = refill_model(session, req)
    session.close()
    return RefillRequestResponse(refill_request=result, message="Refill request withdrawn.")


# ---------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------


@app.get(
    "/api/messages",
    response_model=MessageListResponse,
    summary="List my messages",
    description="Return secure messages between me and my doctors, newest first. Optionally only one doctor's "
    "thread or only unread messages from doctors.",
    tags=["messages"],
    operation_id="list_my_messages",
)
async def list_my_messages(
    doctor_id: Optional[int] = Query(None, description="Only messages with this doctor."),
    unread_only: bool = Query(False, description="Only unread messages received from doctors."),
) -> MessageListResponse:
    session = SessionLocal()
    q = session.query(Message).filter(Message.patient_id == CURRENT_PATIENT_ID)
    if doctor_id is not None:
        q = q.filter(Message.doctor_id == doctor_id)
    if unread_only:
        q = q.filter(Message.direction == "from_doctor", Message.is_read == 0)
    msgs = q.order_by(Message.sent_at.desc(), Message.id.desc()).all()
    result = [message_model(session, m) for m in msgs]
    session.close()
    return MessageListResponse(messages=result, count=len(result))


@app.post(
    "/api/messages",
    response_model=MessageResponse,
    summary="Send a message to a doctor",
    description="Send a secure message from the logged-in patient to one doctor.",
    tags=["messages"],
    operation_id="send_message",
)
async def send_message(
    body: MessageCreateBody = Body(..., description="Recipient, subject and text."),
) -> MessageResponse:
    session = SessionLocal()
    doc = session.query(Doctor).filter(Doctor.id == body.doctor_id).first()
    if doc is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Doctor {body.doctor_id} not found.")
    if not body.subject.strip() or not body.body.strip():
        session.close()
        raise HTTPException(status_code=400, detail="subject and body must not be empty.")
    msg = Message(
        patient_id=CURRENT_PATIENT_ID,
        doctor_id=doc.id,
        direction="to_doctor",
        subject=body.subject.strip(),
        body=body.body.strip(),
        is_read=1,
        sent_at=utc_now(),
    )
    session.add(msg)
    session.commit()
    result = message_model(session, msg)
    session.close()
    return MessageResponse(message=result)


if __name__ == "__main__":
    import uvicorn

    host = os.getenv("HOST", "127.0.0.1")
    port = int(os.getenv("PORT", "8000"))
    uvicorn.run(app, host=host, port=port)
