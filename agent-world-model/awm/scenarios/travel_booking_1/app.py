from fastapi import FastAPI, Query, Path, Body, HTTPException
from pydantic import BaseModel, Field, ConfigDict
from typing import Optional, List
from sqlalchemy import (
    create_engine,
    Column,
    Integer,
    String,
    Float,
    Date,
    DateTime,
    ForeignKey,
    CheckConstraint,
    UniqueConstraint,
    Index,
    func,
)
from sqlalchemy.orm import declarative_base, sessionmaker
from datetime import datetime, date, timezone
import os
import random
import string

database_url = os.getenv("DATABASE_PATH", "sqlite:///outputs/databases/travel_booking_1.db")

engine = create_engine(database_url, connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(bind=engine, autoflush=False, autocommit=False)

Base = declarative_base()


class User(Base):
    __tablename__ = "users"
    id = Column(Integer, primary_key=True)
    full_name = Column(String, nullable=False)
    email = Column(String, nullable=False, unique=True)
    home_airport = Column(String)
    created_at = Column(DateTime, server_default=func.current_timestamp())


class Traveler(Base):
    __tablename__ = "travelers"
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, ForeignKey("users.id"), nullable=False, index=True)
    first_name = Column(String, nullable=False)
    last_name = Column(String, nullable=False)
    date_of_birth = Column(Date, nullable=False)
    passport_number = Column(String)
    created_at = Column(DateTime, server_default=func.current_timestamp())
    updated_at = Column(DateTime, server_default=func.current_timestamp())


class Flight(Base):
    __tablename__ = "flights"
    __table_args__ = (
        CheckConstraint("origin <> destination"),
        CheckConstraint("base_fare >= 0"),
        CheckConstraint("status IN ('scheduled', 'delayed', 'cancelled')"),
    )
    id = Column(Integer, primary_key=True)
    flight_number = Column(String, nullable=False)
    airline = Column(String, nullable=False)
    origin = Column(String, nullable=False)
    destination = Column(String, nullable=False)
    departure_time = Column(DateTime, nullable=False)
    arrival_time = Column(DateTime, nullable=False)
    base_fare = Column(Float, nullable=False)
    status = Column(String, nullable=False, default="scheduled")


class Seat(Base):
    __tablename__ = "seats"
    __table_args__ = (
        UniqueConstraint("flight_id", "seat_number"),
        CheckConstraint("cabin IN ('economy', 'premium', 'business')"),
        CheckConstraint("position IN ('window', 'middle', 'aisle')"),
    )
    id = Column(Integer, primary_key=True)
    flight_id = Column(Integer, ForeignKey("flights.id"), nullable=False)
    seat_number = Column(String, nullable=False)
    cabin = Column(String, nullable=False)
    position = Column(String, nullable=False)
    extra_fee = Column(Float, nullable=False, default=0)


class LoyaltyAccount(Base):
    __tablename__ = "loyalty_accounts"
    __table_args__ = (
        CheckConstraint("program_type IN ('airline', 'hotel')"),
        CheckConstraint("points_balance >= 0"),
    )
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, ForeignKey("users.id"), nullable=False, index=True)
    program_name = Column(String, nullable=False)
    program_type = Column(String, nullable=False)
    airline = Column(String)
    member_number = Column(String, nullable=False, unique=True)
    points_balance = Column(Integer, nullable=False, default=0)
    tier = Column(String)
    created_at = Column(DateTime, server_default=func.current_timestamp())


class Booking(Base):
    __tablename__ = "bookings"
    __table_args__ = (CheckConstraint("status IN ('confirmed', 'cancelled')"),)
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, ForeignKey("users.id"), nullable=False)
    flight_id = Column(Integer, ForeignKey("flights.id"), nullable=False)
    confirmation_code = Column(String, nullable=False, unique=True)
    status = Column(String, nullable=False, default="confirmed")
    total_price = Column(Float, nullable=False, default=0)
    loyalty_account_id = Column(Integer, ForeignKey("loyalty_accounts.id"))
    created_at = Column(DateTime, server_default=func.current_timestamp())
    updated_at = Column(DateTime, server_default=func.current_timestamp())


class BookingPassenger(Base):
    __tablename__ = "booking_passengers"
    __table_args__ = (UniqueConstraint("booking_id", "traveler_id"),)
    id = Column(Integer, primary_key=True)
    booking_id = Column(Integer, ForeignKey("bookings.id"), nullable=False)
    traveler_id = Column(Integer, ForeignKey("travelers.id"), nullable=False)
    seat_id = Column(Integer, ForeignKey("seats.id"))
    created_at = Column(DateTime, server_default=func.current_timestamp())


class HotelReservation(Base):
    __tablename__ = "hotel_reservations"
    __table_args__ = (
        CheckConstraint("nights > 0"),
        CheckConstraint("guests > 0"),
        CheckConstraint("nightly_rate >= 0"),
        CheckConstraint("status IN ('confirmed', 'cancelled')"),
    )
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, ForeignKey("users.id"), nullable=False)
    hotel_name = Column(String, nullable=False)
    city = Column(String, nullable=False)
    check_in_date = Column(Date, nullable=False)
    nights = Column(Integer, nullable=False)
    room_type = Column(String, nullable=False)
    guests = Column(Integer, nullable=False)
    nightly_rate = Column(Float, nullable=False)
    status = Column(String, nullable=False, default="confirmed")
    confirmation_number = Column(String, unique=True)
    created_at = Column(DateTime, server_default=func.current_timestamp())
    updated_at = Column(DateTime, server_default=func.current_timestamp())


Index("idx_flights_route_departure", Flight.origin, Flight.destination, Flight.departure_time)
Index("idx_flights_number", Flight.flight_number)
Index("idx_seats_flight", Seat.flight_id)
Index("idx_bookings_user_status", Booking.user_id, Booking.status)
Index("idx_bookings_flight", Booking.flight_id)
Index("idx_booking_passengers_seat", BookingPassenger.seat_id)
Index("idx_hotel_reservations_user_city", HotelReservation.user_id, HotelReservation.city)

Base.metadata.create_all(engine)

app = FastAPI(
    title="SkyNest Travel API",
    version="1.0.0",
    description="Flight search, bookings, seats, saved travelers, loyalty programs and hotel reservations for the signed-in user.",
)


def now_utc() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


# ---------------------------------------------------------------------------
# Pydantic schemas
# ---------------------------------------------------------------------------


class FlightModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Flight ID.", examples=[1])
    flight_number: str = Field(..., description="Marketing flight number.", examples=["NA 208"])
    airline: str = Field(..., description="Operating airline.", examples=["Nordic Air"])
    origin: str = Field(..., description="Origin airport IATA code.", examples=["OSL"])
    destination: str = Field(..., description="Destination airport IATA code.", examples=["CPH"])
    departure_time: datetime = Field(..., description="Scheduled departure (UTC).")
    arrival_time: datetime = Field(..., description="Scheduled arrival (UTC).")
    base_fare: float = Field(..., description="Fare per passenger before seat fees.", examples=[129.0])
    status: str = Field(..., description="scheduled, delayed or cancelled.", examples=["scheduled"])


class FlightListResponse(BaseModel):
    flights: List[FlightModel] = Field(..., description="Matching flights ordered by departure time.")


class SeatModel(BaseModel):
    id: int = Field(..., description="Seat ID.", examples=[2])
    seat_number: str = Field(..., description="Seat label.", examples=["12A"])
    cabin: str = Field(..., description="economy, premium or business.", examples=["economy"])
    position: str = Field(..., description="window, middle or aisle.", examples=["window"])
    extra_fee: float = Field(..., description="Seat selection fee.", examples=[15.0])
    is_available: bool = Field(..., description="False when a confirmed booking holds the seat.", examples=[True])


class SeatMapResponse(BaseModel):
    flight_id: int = Field(..., description="Flight ID.", examples=[1])
    flight_number: str = Field(..., description="Flight number.", examples=["NA 208"])
    seats: List[SeatModel] = Field(..., description="Seats of the flight.")


class TravelerModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Traveler ID.", examples=[2])
    first_name: str = Field(..., description="First name as in the passport.", examples=["Maya"])
    last_name: str = Field(..., description="Last name as in the passport.", examples=["Chen"])
    date_of_birth: date = Field(..., description="Date of birth (YYYY-MM-DD).", examples=["2012-06-30"])
    passport_number: Optional[str] = Field(None, description="Passport number.", examples=["P5521876"])


class TravelerListResponse(BaseModel):
    travelers: List[TravelerModel] = Field(..., description="Saved traveler profiles.")


class TravelerCreateBody(BaseModel):
    first_name: str = Field(..., description="First name.", examples=["Jonas"])
    last_name: str = Field(..., description="Last name.", examples=["Berg"])
    date_of_birth: date = Field(..., description="Date of birth (YYYY-MM-DD).", examples=["1988-04-17"])
    passport_number: Optional[str] = Field(None, description="Passport number.", examples=["P7733190"])


class TravelerUpdateBody(BaseModel):
    first_name: Optional[str] = Field(None, description="New first name.")
    last_name: Optional[str] = Field(None, description="New last name.")
    date_of_birth: Optional[date] = Field(None, description="New date of birth (YYYY-MM-DD).")
    passport_number: Optional[str] = Field(None, description="New passport number.", examples=["P4410999"])


class TravelerResponse(BaseModel):
    traveler: TravelerModel = Field(..., description="The traveler profile.")


class PassengerModel(BaseModel):
    traveler_id: int = Field(..., description="Traveler ID.", examples=[2])
    traveler_name: str = Field(..., description="Full name of the passenger.", examples=["Maya Chen"])
    seat_number: Optional[str] = Field(None, description="Assigned seat, if any.", examples=["14B"])


class BookingModel(BaseModel):
    id: int = Field(..., description="Booking ID.", examples=[1])
    confirmation_code: str = Field(..., description="Six-character booking reference.", examples=["QX7K2P"])
    status: str = Field(..., description="confirmed or cancelled.", examples=["confirmed"])
    total_price: float = Field(..., description="Total price of fares and seat fees.", examples=[1697.0])
    loyalty_account_id: Optional[int] = Field(None, description="Loyalty account credited for the flight.", examples=[2])
    flight: FlightModel = Field(..., description="The booked flight.")
    passengers: List[PassengerModel] = Field(..., description="Passengers on the booking.")
    created_at: Optional[datetime] = Field(None, description="When the booking was made.")


class BookingListResponse(BaseModel):
    bookings: List[BookingModel] = Field(..., description="My flight bookings, newest first.")


class BookingCreateBody(BaseModel):
    flight_id: int = Field(..., description="Flight to book.", examples=[1])
    traveler_id: int = Field(..., description="Saved traveler who flies.", examples=[2])
    seat_number: Optional[str] = Field(None, description="Seat to reserve, e.g. 12A; none for no seat selection.", examples=["12A"])
    loyalty_account_id: Optional[int] = Field(None, description="Airline loyalty account to credit.", examples=[1])


class PassengerAddBody(BaseModel):
    traveler_id: int = Field(..., description="Saved traveler to add.", examples=[5])
    seat_number: Optional[str] = Field(None, description="Seat to reserve for the new passenger.", examples=["22D"])


class SeatAssignBody(BaseModel):
    seat_number: str = Field(..., description="Seat to move the passenger to.", examples=["14C"])


class BookingLoyaltyBody(BaseModel):
    loyalty_account_id: int = Field(..., description="My airline loyalty account of the flight's airline.", examples=[2])


class BookingResponse(BaseModel):
    booking: BookingModel = Field(..., description="The booking.")


class LoyaltyAccountModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Loyalty account ID.", examples=[2])
    program_name: str = Field(..., description="Program name.", examples=["Atlantic Blue Voyager"])
    program_type: str = Field(..., description="airline or hotel.", examples=["airline"])
    airline: Optional[str] = Field(None, description="Airline of an airline program.", examples=["Atlantic Blue"])
    member_number: str = Field(..., description="Membership number.", examples=["ABV-330918"])
    points_balance: int = Field(..., description="Current points balance.", examples=[61450])
    tier: Optional[str] = Field(None, description="Status tier.", examples=["Gold"])


class LoyaltyAccountListResponse(BaseModel):
    loyalty_accounts: List[LoyaltyAccountModel] = Field(..., description="My loyalty memberships.")


class HotelReservationModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Reservation ID.", examples=[4])
    hotel_name: str = Field(..., description="Hotel name.", examples=["Alpine Lodge"])
    city: str = Field(..., description="City.", examples=["Zermatt"])
    check_in_date: date = Field(..., description="Check-in date (YYYY-MM-DD).")
    nights: int = Field(..., description="Number of nights.", examples=[4])
    room_type: str = Field(..., description="Room type.", examples=["suite"])
    guests: int = Field(..., description="Number of guests.", examples=[3])
    nightly_rate: float = Field(..., description="Price per night.", examples=[310.0])
    status: str = Field(..., description="confirmed or cancelled.", examples=["confirmed"])
    confirmation_number: Optional[str] = Field(None, description="Hotel confirmation number.", examples=["AL-30415"])
    created_at: Optional[datetime] = Field(None, description="When the reservation was made.")


class HotelReservationListResponse(BaseModel):
    reservations: List[HotelReservationModel] = Field(..., description="My hotel reservations ordered by check-in date.")


class HotelReservationCreateBody(BaseModel):
    hotel_name: str = Field(..., description="Hotel name.", examples=["Harbor View Hotel"])
    city: str = Field(..., description="City of the hotel.", examples=["Lisbon"])
    check_in_date: date = Field(..., description="Check-in date (YYYY-MM-DD).", examples=["2027-05-10"])
    nights: int = Field(..., description="Number of nights, at least 1.", examples=[3])
    room_type: str = Field("double", description="Room type, e.g. single, double, family, suite.", examples=["double"])
    guests: int = Field(1, description="Number of guests, at least 1.", examples=[2])
    nightly_rate: float = Field(..., description="Quoted price per night.", examples=[145.0])


class HotelReservationUpdateBody(BaseModel):
    check_in_date: Optional[date] = Field(None, description="New check-in date (YYYY-MM-DD).")
    nights: Optional[int] = Field(None, description="New number of nights.", examples=[5])
    room_type: Optional[str] = Field(None, description="New room type.", examples=["family"])
    guests: Optional[int] = Field(None, description="New number of guests.", examples=[4])


class HotelReservationResponse(BaseModel):
    reservation: HotelReservationModel = Field(..., description="The reservation.")


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def fail(session, status_code: int, detail: str):
    session.close()
    raise HTTPException(status_code=status_code, detail=detail)


def seat_holder(session, seat_id: int) -> Optional[BookingPassenger]:
    return (
        session.query(BookingPassenger)
        .join(Booking, BookingPassenger.booking_id == Booking.id)
        .filter(BookingPassenger.seat_id == seat_id, Booking.status == "confirmed")
        .first()
    )


def find_seat(session, flight_id: int, seat_number: str) -> Optional[Seat]:
    return (
        session.query(Seat)
        .filter(Seat.flight_id == flight_id, func.upper(Seat.seat_number) == seat_number.strip().upper())
        .first()
    )


def new_confirmation_code(session) -> str:
    alphabet = string.ascii_uppercase + string.digits
    while True:
        code = "".join(random.choice(alphabet) for _ in range(6))
        if session.query(Booking).filter(Booking.confirmation_code == code).first() is None:
            return code


def booking_to_model(session, bk: Booking) -> BookingModel:
    flight = session.query(Flight).filter(Flight.id == bk.flight_id).first()
    passengers: List[PassengerModel] = []
    rows = (
        session.query(BookingPassenger, Traveler)
        .join(Traveler, BookingPassenger.traveler_id == Traveler.id)
        .filter(BookingPassenger.booking_id == bk.id)
        .order_by(BookingPassenger.id.asc())
        .all()
    )
    for bp, tv in rows:
        seat = session.query(Seat).filter(Seat.id == bp.seat_id).first() if bp.seat_id is not None else None
        passengers.append(
            PassengerModel(
                traveler_id=tv.id,
                traveler_name=f"{tv.first_name} {tv.last_name}",
                seat_number=seat.seat_number if seat is not None else None,
            )
        )
    return BookingModel(
        id=bk.id,
        confirmation_code=bk.confirmation_code,
        status=bk.status,
        total_price=round(bk.total_price, 2),
        loyalty_account_id=bk.loyalty_account_id,
        flight=FlightModel.model_validate(flight),
        passengers=passengers,
        created_at=bk.created_at,
    )


def reserve_seat(session, flight: Flight, seat_number: Optional[str]) -> Optional[Seat]:
    """Return the free seat of that number on the flight, or fail with 404/409."""
    if not seat_number:
        return None
    seat = find_seat(session, flight.id, seat_number)
    if seat is None:
        fail(session, 404, f"Seat {seat_number} does not exist on flight {flight.flight_number}")
    if seat_holder(session, seat.id) is not None:
        fail(session, 409, f"Seat {seat.seat_number} on flight {flight.flight_number} is already taken")
    return seat


# ---------------------------------------------------------------------------
# flights and seats
# ---------------------------------------------------------------------------


@app.get(
    "/api/flights",
    response_model=FlightListResponse,
    summary="Search flights",
    description="Search flights by origin/destination airport code, airline or flight number, ordered by departure time.",
    tags=["flights"],
    operation_id="search_flights",
)
async def search_flights(
    origin: Optional[str] = Query(None, description="Origin IATA code, e.g. CPH."),
    destination: Optional[str] = Query(None, description="Destination IATA code, e.g. LHR."),
    airline: Optional[str] = Query(None, description="Airline name (partial, case-insensitive)."),
    flight_number: Optional[str] = Query(None, description="Flight number, e.g. 'NA 208' (spaces optional)."),
    include_cancelled: bool = Query(False, description="Also return cancelled flights."),
) -> FlightListResponse:
    session = SessionLocal()
    q = session.query(Flight)
    if origin:
        q = q.filter(Flight.origin == origin.strip().upper())
    if destination:
        q = q.filter(Flight.destination == destination.strip().upper())
    if airline:
        q = q.filter(Flight.airline.ilike(f"%{airline}%"))
    if flight_number:
        wanted = flight_number.replace(" ", "").upper()
        q = q.filter(func.upper(func.replace(Flight.flight_number, " ", "")) == wanted)
    if not include_cancelled:
        q = q.filter(Flight.status != "cancelled")
    rows = q.order_by(Flight.departure_time.asc()).all()
    flights = [FlightModel.model_validate(f) for f in rows]
    session.close()
    return FlightListResponse(flights=flights)


@app.get(
    "/api/flights/{flight_id}/seats",
    response_model=SeatMapResponse,
    summary="Get the seat map of a flight",
    description="List the seats of a flight with cabin, position, seat fee and whether each seat is still free.",
    tags=["flights"],
    operation_id="get_flight_seats",
)
async def get_flight_seats(
    flight_id: int = Path(..., description="Flight ID."),
    cabin: Optional[str] = Query(None, description="Only this cabin: economy, premium or business."),
    available_only: bool = Query(False, description="Only seats that are still free."),
) -> SeatMapResponse:
    session = SessionLocal()
    flight = session.query(Flight).filter(Flight.id == flight_id).first()
    if flight is None:
        fail(session, 404, f"Flight {flight_id} not found")
    q = session.query(Seat).filter(Seat.flight_id == flight_id)
    if cabin:
        q = q.filter(Seat.cabin == cabin.lower())
    seats: List[SeatModel] = []
    for s in q.order_by(Seat.id.asc()).all():
        free = seat_holder(session, s.id) is None
        if available_only and not free:
            continue
        seats.append(SeatModel(id=s.id, seat_number=s.seat_number, cabin=s.cabin, position=s.position,
                               extra_fee=s.extra_fee, is_available=free))
    result = SeatMapResponse(flight_id=flight.id, flight_number=flight.flight_number, seats=seats)
    session.close()
    return result


# ---------------------------------------------------------------------------
# travelers
# ---------------------------------------------------------------------------


@app.get(
    "/api/travelers",
    response_model=TravelerListResponse,
    summary="List saved travelers",
    description="List the traveler profiles saved on my account, optionally filtered by a name fragment.",
    tags=["travelers"],
    operation_id="list_travelers",
)
async def list_travelers(
    name: Optional[str] = Query(None, description="Case-insensitive part of the first or last name."),
) -> TravelerListResponse:
    session = SessionLocal()
    user_id = 1
    q = session.query(Traveler).filter(Traveler.user_id == user_id)
    if name:
        pattern = f"%{name.strip()}%"
        q = q.filter(
            Traveler.first_name.ilike(pattern)
            | Traveler.last_name.ilike(pattern)
            | (Traveler.first_name + " " + Traveler.last_name).ilike(pattern)
        )
    rows = q.order_by(Traveler.id.asc()).all()
    travelers = [TravelerModel.model_validate(t) for t in rows]
    session.close()
    return TravelerListResponse(travelers=travelers)


@app.post(
    "/api/travelers",
    response_model=TravelerResponse,
    summary="Save a traveler profile",
    description="Save a new traveler (name as in the passport, date of birth, passport number) for use in bookings.",
    tags=["travelers"],
    operation_id="create_traveler",
)
async def create_traveler(
    body: TravelerCreateBody = Body(..., description="Traveler profile."),
) -> TravelerResponse:
    session = SessionLocal()
    user_id = 1
    if not body.first_name.strip() or not body.last_name.strip():
        fail(session, 400, "First and last name are required")
    existing = (
        session.query(Traveler)
        .filter(
            Traveler.user_id == user_id,
            func.lower(Traveler.first_name) == body.first_name.strip().lower(),
            func.lower(Traveler.last_name) == body.last_name.strip().lower(),
            Traveler.date_of_birth == body.date_of_birth,
        )
        .first()
    )
    if existing is not None:
        fail(session, 409, f"Traveler {existing.first_name} {existing.last_name} is already saved (id {existing.id})")
    now = now_utc()
    tv = Traveler(
        user_id=user_id,
        first_name=body.first_name.strip(),
        last_name=body.last_name.strip(),
        date_of_birth=body.date_of_birth,
        passport_number=body.passport_number,
        created_at=now,
        updated_at=now,
    )
    session.add(tv)
    session.commit()
    result = TravelerModel.model_validate(tv)
    session.close()
    return TravelerResponse(traveler=result)


@app.patch(
    "/api/travelers/{traveler_id}",
    response_model=TravelerResponse,
    summary="Update a traveler profile",
    description="Change the name, date of birth or passport number of a saved traveler.",
    tags=["travelers"],
    operation_id="update_traveler",
)
async def update_traveler(
    traveler_id: int = Path(..., description="Traveler ID."),
    body: TravelerUpdateBody = Body(..., description="Fields to change."),
) -> TravelerResponse:
    session = SessionLocal()
    user_id = 1
    tv = session.query(Traveler).filter(Traveler.id == traveler_id, Traveler.user_id == user_id).first()
    if tv is None:
        fail(session, 404, f"Traveler {traveler_id} not found")
    if body.first_name is not None:
        tv.first_name = body.first_name.strip()
    if body.last_name is not None:
        tv.last_name = body.last_name.strip()
    if body.date_of_birth is not None:
        tv.date_of_birth = body.date_of_birth
    if body.passport_number is not None:
        tv.passport_number = body.passport_number.strip()
    tv.updated_at = now_utc()
    session.commit()
    result = TravelerModel.model_validate(tv)
    session.close()
    return TravelerResponse(traveler=result)


# ---------------------------------------------------------------------------
# bookings
# ---------------------------------------------------------------------------


@app.get(
    "/api/bookings",
    response_model=BookingListResponse,
    summary="List my flight bookings",
    description="List my bookings with flight, passengers and seats, optionally filtered by status or confirmation code.",
    tags=["bookings"],
    operation_id="list_bookings",
)
async def list_bookings(
    status: Optional[str] = Query(None, description="confirmed or cancelled."),
    confirmation_code: Optional[str] = Query(None, description="Six-character booking reference."),
) -> BookingListResponse:
    session = SessionLocal()
    user_id = 1
    q = session.query(Booking).filter(Booking.user_id == user_id)
    if status:
        q = q.filter(Booking.status == status.lower())
    if confirmation_code:
        q = q.filter(func.upper(Booking.confirmation_code) == confirmation_code.strip().upper())
    rows = q.order_by(Booking.created_at.desc(), Booking.id.desc()).all()
    bookings = [booking_to_model(session, b) for b in rows]
    session.close()
    return BookingListResponse(bookings=bookings)


@app.post(
    "/api/bookings",
    response_model=BookingResponse,
    summary="Book a flight",
    description="Create a new booking on a flight for one saved traveler, optionally reserving a seat (409 when the seat is taken) and crediting a loyalty account. Add more passengers with add_passenger_to_booking.",
    tags=["bookings"],
    operation_id="create_booking",
)
async def create_booking(
    body: BookingCreateBody = Body(..., description="Booking request."),
) -> BookingResponse:
    session = SessionLocal()
    user_id = 1
    flight = session.query(Flight).filter(Flight.id == body.flight_id).first()
    if flight is None:
        fail(session, 404, f"Flight {body.flight_id} not found")
    if flight.status == "cancelled":
        fail(session, 409, f"Flight {flight.flight_number} is cancelled and cannot be booked")
    tv = session.query(Traveler).filter(Traveler.id == body.traveler_id, Traveler.user_id == user_id).first()
    if tv is None:
        fail(session, 404, f"Traveler {body.traveler_id} not found")
    if body.loyalty_account_id is not None:
        la = (
            session.query(LoyaltyAccount)
            .filter(LoyaltyAccount.id == body.loyalty_account_id, LoyaltyAccount.user_id == user_id)
            .first()
        )
        if la is None:
            fail(session, 404, f"Loyalty account {body.loyalty_account_id} not found")
        if la.program_type != "airline" or la.airline != flight.airline:
            fail(session, 400, f"{la.program_name} cannot be credited for a {flight.airline} flight")
    seat = reserve_seat(session, flight, body.seat_number)
    now = now_utc()
    bk = Booking(
        user_id=user_id,
        flight_id=flight.id,
        confirmation_code=new_confirmation_code(session),
        status="confirmed",
        total_price=round(flight.base_fare + (seat.extra_fee if seat is not None else 0), 2),
        loyalty_account_id=body.loyalty_account_id,
        created_at=now,
        updated_at=now,
    )
    session.add(bk)
    session.flush()
    session.add(BookingPassenger(booking_id=bk.id, traveler_id=tv.id,
                                 seat_id=seat.id if seat is not None else None, created_at=now))
    session.commit()
    result = booking_to_model(session, bk)
    session.close()
    return BookingResponse(booking=result)


@app.post(
    "/api/bookings/{booking_id}/passengers",
    response_model=BookingResponse,
    summary="Add a passenger to a booking",
    description="Add another saved traveler to an existing confirmed booking, optionally with a seat; the fare and seat fee are added to the total.",
    tags=["bookings"],
    operation_id="add_passenger_to_booking",
)
async def add_passenger_to_booking(
    booking_id: int = Path(..., description="Booking ID."),
    body: PassengerAddBody = Body(..., description="Passenger to add."),
) -> BookingResponse:
    session = SessionLocal()
    user_id = 1
    bk = session.query(Booking).filter(Booking.id == booking_id, Booking.user_id == user_id).first()
    if bk is None:
        fail(session, 404, f"Booking {booking_id} not found")
    if bk.status != "confirmed":
        fail(session, 409, f"Booking {bk.confirmation_code} is cancelled")
    tv = session.query(Traveler).filter(Traveler.id == body.traveler_id, Traveler.user_id == user_id).first()
    if tv is None:
        fail(session, 404, f"Traveler {body.traveler_id} not found")
    already = (
        session.query(BookingPassenger)
        .filter(BookingPassenger.booking_id == bk.id, BookingPassenger.traveler_id == tv.id)
        .first()
    )
    if already is not None:
        fail(session, 409, f"{tv.first_name} {tv.last_name} is already on booking {bk.confirmation_code}")
    flight = session.query(Flight).filter(Flight.id == bk.flight_id).first()
    seat = reserve_seat(session, flight, body.seat_number)
    now = now_utc()
    session.add(BookingPassenger(booking_id=bk.id, traveler_id=tv.id,
                                 seat_id=seat.id if seat is not None else None, created_at=now))
    bk.total_price = round(bk.total_price + flight.base_fare + (seat.extra_fee if seat is not None else 0), 2)
    bk.updated_at = now
    session.commit()
    result = booking_to_model(session, bk)
    session.close()
    return BookingResponse(booking=result)


@app.put(
    "/api/bookings/{booking_id}/passengers/{traveler_id}/seat",
    response_model=BookingResponse,
    summary="Change a passenger's seat",
    description="Move a passenger of a confirmed booking to another free seat on the same flight (409 when the seat is taken). Seat fees are adjusted.",
    tags=["bookings"],
    operation_id="assign_seat",
)
async def assign_seat(
    booking_id: int = Path(..., description="Booking ID."),
    traveler_id: int = Path(..., description="Traveler ID of the passenger."),
    body: SeatAssignBody = Body(..., description="New seat."),
) -> BookingResponse:
    session = SessionLocal()
    user_id = 1
    bk = session.query(Booking).filter(Booking.id == booking_id, Booking.user_id == user_id).first()
    if bk is None:
        fail(session, 404, f"Booking {booking_id} not found")
    if bk.status != "confirmed":
        fail(session, 409, f"Booking {bk.confirmation_code} is cancelled")
    bp = (
        session.query(BookingPassenger)
        .filter(BookingPassenger.booking_id == bk.id, BookingPassenger.traveler_id == traveler_id)
        .first()
    )
    if bp is None:
        fail(session, 404, f"Traveler {traveler_id} is not a passenger on booking {bk.confirmation_code}")
    flight = session.query(Flight).filter(Flight.id == bk.flight_id).first()
    old_seat = session.query(Seat).filter(Seat.id == bp.seat_id).first() if bp.seat_id is not None else None
    if old_seat is not None and old_seat.seat_number.upper() == body.seat_number.strip().upper():
        result = booking_to_model(session, bk)
        session.close()
        return BookingResponse(booking=result)
    seat = reserve_seat(session, flight, body.seat_number)
    old_fee = old_seat.extra_fee if old_seat is not None else 0
    bp.seat_id = seat.id
    bk.total_price = round(bk.total_price - old_fee + seat.extra_fee, 2)
    bk.updated_at = now_utc()
    session.commit()
    result = booking_to_model(session, bk)
    session.close()
    return BookingResponse(booking=result)


@app.patch(
    "/api/bookings/{booking_id}",
    response_model=BookingResponse,
    summary="Credit a loyalty account to a booking",
    description="Attach one of my airline loyalty accounts to a booking so the flight earns points; the program must belong to the flight's airline (400 otherwise).",
    tags=["bookings", "loyalty"],
    operation_id="update_booking_loyalty",
)
async def update_booking_loyalty(
    booking_id: int = Path(..., description="Booking ID."),
    body: BookingLoyaltyBody = Body(..., description="Loyalty account to credit."),
) -> BookingResponse:
    session = SessionLocal()
    user_id = 1
    bk = session.query(Booking).filter(Booking.id == booking_id, Booking.user_id == user_id).first()
    if bk is None:
        fail(session, 404, f"Booking {booking_id} not found")
    la = (
        session.query(LoyaltyAccount)
        .filter(LoyaltyAccount.id == body.loyalty_account_id, LoyaltyAccount.user_id == user_id)
        .first()
    )
    if la is None:
        fail(session, 404, f"Loyalty account {body.loyalty_account_id} not found")
    flight = session.query(Flight).filter(Flight.id == bk.flight_id).first()
    if la.program_type != "airline" or la.airline != flight.airline:
        fail(session, 400, f"{la.program_name} cannot be credited for a {flight.airline} flight")
    bk.loyalty_account_id = la.id
    bk.updated_at = now_utc()
    session.commit()
    result = booking_to_model(session, bk)
    session.close()
    return BookingResponse(booking=result)


@app.delete(
    "/api/bookings/{booking_id}",
    response_model=BookingResponse,
    summary="Cancel a booking",
    description="Cancel a confirmed booking; its seats are released. The booking stays in the list with status cancelled.",
    tags=["bookings"],
    operation_id="cancel_booking",
)
async def cancel_booking(
    booking_id: int = Path(..., description="Booking ID."),
) -> BookingResponse:
    session = SessionLocal()
    user_id = 1
    bk = session.query(Booking).filter(Booking.id == booking_id, Booking.user_id == user_id).first()
    if bk is None:
        fail(session, 404, f"Booking {booking_id} not found")
    if bk.status == "cancelled":
        fail(session, 409, f"Booking {bk.confirmation_code} is already cancelled")
    bk.status = "cancelled"
    bk.updated_at = now_utc()
    session.commit()
    result = booking_to_model(session, bk)
    session.close()
    return BookingResponse(booking=result)


# ---------------------------------------------------------------------------
# loyalty
# ---------------------------------------------------------------------------


@app.get(
    "/api/loyalty-accounts",
    response_model=LoyaltyAccountListResponse,
    summary="List my loyalty memberships",
    description="List my airline and hotel loyalty accounts with member numbers, tiers and points balances.",
    tags=["loyalty"],
    operation_id="list_loyalty_accounts",
)
async def list_loyalty_accounts(
    program_type: Optional[str] = Query(None, description="airline or hotel."),
) -> LoyaltyAccountListResponse:
    session = SessionLocal()
    user_id = 1
    q = session.query(LoyaltyAccount).filter(LoyaltyAccount.user_id == user_id)
    if program_type:
        q = q.filter(LoyaltyAccount.program_type == program_type.lower())
    rows = q.order_by(LoyaltyAccount.id.asc()).all()
    accounts = [LoyaltyAccountModel.model_validate(a) for a in rows]
    session.close()
    return LoyaltyAccountListResponse(loyalty_accounts=accounts)


# ---------------------------------------------------------------------------
# hotels
# ---------------------------------------------------------------------------


@app.get(
    "/api/hotel-reservations",
    response_model=HotelReservationListResponse,
    summary="List my hotel reservations",
    description="List my hotel reservations ordered by check-in date, optionally by city, hotel name or status.",
    tags=["hotels"],
    operation_id="list_hotel_reservations",
)
async def list_hotel_reservations(
    city: Optional[str] = Query(None, description="City (case-insensitive)."),
    hotel_name: Optional[str] = Query(None, description="Part of the hotel name (case-insensitive)."),
    status: Optional[str] = Query(None, description="confirmed or cancelled."),
) -> HotelReservationListResponse:
    session = SessionLocal()
    user_id = 1
    q = session.query(HotelReservation).filter(HotelReservation.user_id == user_id)
    if city:
        q = q.filter(func.lower(HotelReservation.city) == city.strip().lower())
    if hotel_name:
        q = q.filter(HotelReservation.hotel_name.ilike(f"%{hotel_name.strip()}%"))
    if status:
        q = q.filter(HotelReservation.status == status.lower())
    rows = q.order_by(HotelReservation.check_in_date.asc(), HotelReservation.id.asc()).all()
    items = [HotelReservationModel.model_validate(r) for r in rows]
    session.close()
    return HotelReservationListResponse(reservations=items)


@app.post(
    "/api/hotel-reservations",
    response_model=HotelReservationResponse,
    summary="Reserve a hotel room",
    description="Create a hotel reservation for a check-in date and number of nights at the quoted nightly rate.",
    tags=["hotels"],
    operation_id="create_hotel_reservation",
)
async def create_hotel_reservation(
    body: HotelReservationCreateBody = Body(..., description="Reservation request."),
) -> HotelReservationResponse:
    session = SessionLocal()
    user_id = 1
    if body.nights < 1 or body.guests < 1 or body.nightly_rate < 0:
        fail(session, 400, "nights and guests must be at least 1 and nightly_rate not negative")
    if not body.hotel_name.strip() or not body.city.strip():
        fail(session, 400, "hotel_name and city are required")
    now = now_utc()
    number = f"{''.join(w[0] for w in body.hotel_name.split()[:2]).upper()}-{random.randint(10000, 99999)}"
    while session.query(HotelReservation).filter(HotelReservation.confirmation_number == number).first() is not None:
        number = f"{number.split('-')[0]}-{random.randint(10000, 99999)}"
    res = HotelReservation(
        user_id=user_id,
        hotel_name=body.hotel_name.strip(),
        city=body.city.strip(),
        check_in_date=body.check_in_date,
        nights=body.nights,
        room_type=body.room_type.strip().lower(),
        guests=body.guests,
        nightly_rate=round(body.nightly_rate, 2),
        status="confirmed",
        confirmation_number=number,
        created_at=now,
        updated_at=now,
    )
    session.add(res)
    session.commit()
    result = HotelReservationModel.model_validate(res)
    session.close()
    return HotelReservationResponse(reservation=result)


@app.patch(
    "/api/hotel-reservations/{reservation_id}",
    response_model=HotelReservationResponse,
    summary="Modify a hotel reservation",
    description="Change the check-in date, number of nights, room type or number of guests of a confirmed reservation.",
    tags=["hotels"],
    operation_id="update_hotel_reservation",
)
async def update_hotel_reservation(
    reservation_id: int = Path(..., description="Reservation ID."),
    body: HotelReservationUpdateBody = Body(..., description="Fields to change."),
) -> HotelReservationResponse:
    session = SessionLocal()
    user_id = 1
    res = (
        session.query(HotelReservation)
        .filter(HotelReservation.id == reservation_id, HotelReservation.user_id == user_id)
        .first()
    )
    if res is None:
        fail(session, 404, f"Hotel reservation {reservation_id} not found")
    if res.status != "confirmed":
        fail(session, 409, f"Hotel reservation {reservation_id} is cancelled")
    if (body.nights is not None and body.nights < 1) or (body.guests is not None and body.guests < 1):
        fail(session, 400, "nights and guests must be at least 1")
    if body.check_in_date is not None:
        res.check_in_date = body.check_in_date
    if body.nights is not None:
        res.nights = body.nights
    if body.room_type is not None:
        res.room_type = body.room_type.strip().lower()
    if body.guests is not None:
        res.guests = body.guests
    res.updated_at = now_utc()
    session.commit()
    result = HotelReservationModel.model_validate(res)
    session.close()
    return HotelReservationResponse(reservation=result)


@app.delete(
    "/api/hotel-reservations/{reservation_id}",
    response_model=HotelReservationResponse,
    summary="Cancel a hotel reservation",
    description="Cancel a confirmed hotel reservation; it stays in the list with status cancelled.",
    tags=["hotels"],
    operation_id="cancel_hotel_reservation",
)
async def cancel_hotel_reservation(
    reservation_id: int = Path(..., description="Reservation ID."),
) -> HotelReservationResponse:
    session = SessionLocal()
    user_id = 1
    res = (
        session.query(HotelReservation)
        .filter(HotelReservation.id == reservation_id, HotelReservation.user_id == user_id)
        .first()
    )
    if res is None:
        fail(session, 404, f"Hotel reservation {reservation_id} not found")
    if res.status == "cancelled":
        fail(session, 409, f"Hotel reservation {reservation_id} is already cancelled")
    res.status = "cancelled"
    res.updated_at = now_utc()
    session.commit()
    result = HotelReservationModel.model_validate(res)
    session.close()
    return HotelReservationResponse(reservation=result)


if __name__ == "__main__":
    import uvicorn

    host = os.getenv("HOST", "127.0.0.1")
    port = int(os.getenv("PORT", "8000"))
    uvicorn.run(app, host=host, port=port)
