from fastapi import FastAPI, Query, Path, Body, HTTPException
from pydantic import BaseModel, Field, ConfigDict
from typing import Optional, List
from sqlalchemy import (
    create_engine,
    Column,
    Integer,
    String,
    Text,
    Float,
    DateTime,
    ForeignKey,
    CheckConstraint,
    Index,
    func,
)
from sqlalchemy.orm import declarative_base, sessionmaker
from datetime import datetime, timedelta, timezone
import os

database_url = os.getenv("DATABASE_PATH", "sqlite:///outputs/databases/library_lending_1.db")

engine = create_engine(database_url, connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(bind=engine, autoflush=False, autocommit=False)

Base = declarative_base()

CURRENT_MEMBER_ID = 1
LOAN_PERIOD_DAYS = 21
MAX_RENEWALS = 2
ACTIVE_HOLD_STATUSES = ("waiting", "ready")
PAYMENT_METHODS = ("card", "cash", "account_credit")


class Branch(Base):
    __tablename__ = "branches"
    id = Column(Integer, primary_key=True)
    name = Column(String, nullable=False, unique=True)
    address = Column(String, nullable=False)
    phone = Column(String)
    opening_hours = Column(String)
    created_at = Column(DateTime, server_default=func.current_timestamp())


class Member(Base):
    __tablename__ = "members"
    __table_args__ = (
        CheckConstraint("status IN ('active', 'suspended', 'expired')", name="ck_members_status"),
        CheckConstraint("max_loans > 0", name="ck_members_max_loans"),
    )
    id = Column(Integer, primary_key=True)
    full_name = Column(String, nullable=False)
    email = Column(String, nullable=False, unique=True)
    card_number = Column(String, nullable=False, unique=True)
    home_branch_id = Column(Integer, ForeignKey("branches.id"), nullable=False)
    status = Column(String, nullable=False, default="active")
    max_loans = Column(Integer, nullable=False, default=5)
    created_at = Column(DateTime, server_default=func.current_timestamp())


class Book(Base):
    __tablename__ = "books"
    __table_args__ = (CheckConstraint("publication_year > 0", name="ck_books_year"),)
    id = Column(Integer, primary_key=True)
    title = Column(String, nullable=False)
    author = Column(String, nullable=False)
    isbn = Column(String, unique=True)
    genre = Column(String)
    publication_year = Column(Integer)
    created_at = Column(DateTime, server_default=func.current_timestamp())


class Copy(Base):
    __tablename__ = "copies"
    __table_args__ = (
        CheckConstraint(
            "status IN ('available', 'on_loan', 'on_hold_shelf', 'in_repair', 'lost')", name="ck_copies_status"
        ),
    )
    id = Column(Integer, primary_key=True)
    book_id = Column(Integer, ForeignKey("books.id"), nullable=False)
    branch_id = Column(Integer, ForeignKey("branches.id"), nullable=False)
    barcode = Column(String, nullable=False, unique=True)
    status = Column(String, nullable=False, default="available")
    shelf_location = Column(String)
    acquired_at = Column(DateTime, server_default=func.current_timestamp())


class Loan(Base):
    __tablename__ = "loans"
    __table_args__ = (
        CheckConstraint("renewals >= 0 AND renewals <= 2", name="ck_loans_renewals"),
        CheckConstraint("status IN ('active', 'returned', 'lost')", name="ck_loans_status"),
    )
    id = Column(Integer, primary_key=True)
    copy_id = Column(Integer, ForeignKey("copies.id"), nullable=False)
    member_id = Column(Integer, ForeignKey("members.id"), nullable=False)
    checked_out_at = Column(DateTime, nullable=False, server_default=func.current_timestamp())
    due_at = Column(DateTime, nullable=False)
    returned_at = Column(DateTime)
    return_branch_id = Column(Integer, ForeignKey("branches.id"))
    renewals = Column(Integer, nullable=False, default=0)
    status = Column(String, nullable=False, default="active")


class Hold(Base):
    __tablename__ = "holds"
    __table_args__ = (
        CheckConstraint("status IN ('waiting', 'ready', 'fulfilled', 'cancelled')", name="ck_holds_status"),
    )
    id = Column(Integer, primary_key=True)
    book_id = Column(Integer, ForeignKey("books.id"), nullable=False)
    member_id = Column(Integer, ForeignKey("members.id"), nullable=False)
    pickup_branch_id = Column(Integer, ForeignKey("branches.id"), nullable=False)
    status = Column(String, nullable=False, default="waiting")
    placed_at = Column(DateTime, nullable=False, server_default=func.current_timestamp())
    expires_at = Column(DateTime)
    notes = Column(Text)


class Fine(Base):
    __tablename__ = "fines"
    __table_args__ = (
        CheckConstraint("amount >= 0", name="ck_fines_amount"),
        CheckConstraint("status IN ('unpaid', 'paid', 'waived')", name="ck_fines_status"),
        CheckConstraint(
            "payment_method IS NULL OR payment_method IN ('card', 'cash', 'account_credit')",
            name="ck_fines_payment_method",
        ),
    )
    id = Column(Integer, primary_key=True)
    member_id = Column(Integer, ForeignKey("members.id"), nullable=False)
    loan_id = Column(Integer, ForeignKey("loans.id"))
    amount = Column(Float, nullable=False)
    reason = Column(String, nullable=False)
    status = Column(String, nullable=False, default="unpaid")
    issued_at = Column(DateTime, server_default=func.current_timestamp())
    paid_at = Column(DateTime)
    payment_method = Column(String)


Index("idx_branches_name", Branch.name)
Index("idx_members_home_branch_id", Member.home_branch_id)
Index("idx_books_title", Book.title)
Index("idx_books_author", Book.author)
Index("idx_copies_book_id", Copy.book_id)
Index("idx_copies_branch_status", Copy.branch_id, Copy.status)
Index("idx_loans_member_status", Loan.member_id, Loan.status)
Index("idx_loans_copy_id", Loan.copy_id)
Index("idx_holds_book_status", Hold.book_id, Hold.status, Hold.placed_at)
Index("idx_holds_member_id", Hold.member_id)
Index("idx_fines_member_status", Fine.member_id, Fine.status)

Base.metadata.create_all(engine)

app = FastAPI(
    title="City Public Library Lending API",
    version="1.0.0",
    description="Catalogue search, loans, holds and fines for a member of a public library system.",
)


def utc_now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


# ---------------------------------------------------------------------------
# Pydantic models
# ---------------------------------------------------------------------------


class BranchModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Branch ID.", examples=[2])
    name: str = Field(..., description="Branch name.", examples=["Riverside Branch"])
    address: str = Field(..., description="Street address of the branch.", examples=["18 Quay Road"])
    phone: Optional[str] = Field(None, description="Branch phone number.", examples=["555-0102"])
    opening_hours: Optional[str] = Field(None, description="Opening hours summary.", examples=["Mon-Sat 10:00-18:00"])


class BranchListResponse(BaseModel):
    branches: List[BranchModel] = Field(..., description="All library branches.")


class BookSummaryModel(BaseModel):
    id: int = Field(..., description="Book ID.", examples=[1])
    title: str = Field(..., description="Book title.", examples=["Project Hail Mary"])
    author: str = Field(..., description="Author name.", examples=["Andy Weir"])
    isbn: Optional[str] = Field(None, description="ISBN-13.", examples=["9780593135204"])
    genre: Optional[str] = Field(None, description="Genre.", examples=["Science Fiction"])
    publication_year: Optional[int] = Field(None, description="Year of first publication.", examples=[2021])
    total_copies: int = Field(..., description="Number of copies the library owns across all branches.", examples=[3])
    available_copies: int = Field(..., description="Copies currently available to borrow, all branches.", examples=[2])


class BookSearchResponse(BaseModel):
    books: List[BookSummaryModel] = Field(..., description="Matching books.")
    count: int = Field(..., description="Number of books returned.", examples=[1])


class CopyModel(BaseModel):
    id: int = Field(..., description="Copy ID (use it to check the copy out).", examples=[1])
    barcode: str = Field(..., description="Copy barcode.", examples=["LIB-000101"])
    branch_id: int = Field(..., description="ID of the branch holding the copy.", examples=[1])
    branch_name: str = Field(..., description="Name of the branch holding the copy.", examples=["Central Library"])
    status: str = Field(..., description="available, on_loan, on_hold_shelf, in_repair or lost.", examples=["available"])
    shelf_location: Optional[str] = Field(None, description="Shelf mark.", examples=["SF WEI"])


class BookDetailResponse(BaseModel):
    book: BookSummaryModel = Field(..., description="Book record with copy counts.")
    copies: List[CopyModel] = Field(..., description="Every copy of the book with its branch and status.")


class MemberModel(BaseModel):
    id: int = Field(..., description="Member ID.", examples=[1])
    full_name: str = Field(..., description="Member full name.", examples=["Jordan Reyes"])
    email: str = Field(..., description="Contact email.", examples=["jordan.reyes@example.com"])
    card_number: str = Field(..., description="Library card number.", examples=["LC-100001"])
    home_branch_id: int = Field(..., description="Home branch ID.", examples=[1])
    home_branch_name: Optional[str] = Field(None, description="Home branch name.", examples=["Central Library"])
    status: str = Field(..., description="Membership status.", examples=["active"])
    max_loans: int = Field(..., description="Maximum number of simultaneous loans.", examples=[6])
    active_loans: int = Field(..., description="Number of loans currently checked out.", examples=[5])
    unpaid_fines_total: float = Field(..., description="Sum of unpaid fines.", examples=[4.75])
    created_at: Optional[datetime] = Field(None, description="Membership start.")


class MemberUpdateBody(BaseModel):
    email: Optional[str] = Field(None, description="New contact email.", examples=["jordan.reyes@example.org"])
    home_branch_id: Optional[int] = Field(None, description="New home branch ID.", examples=[2])


class LoanModel(BaseModel):
    id: int = Field(..., description="Loan ID.", examples=[1])
    copy_id: int = Field(..., description="Borrowed copy ID.", examples=[4])
    book_id: int = Field(..., description="Book ID of the borrowed copy.", examples=[2])
    book_title: str = Field(..., description="Title of the borrowed book.", examples=["Piranesi"])
    barcode: str = Field(..., description="Barcode of the borrowed copy.", examples=["LIB-000201"])
    branch_id: int = Field(..., description="Branch the copy currently belongs to.", examples=[1])
    branch_name: str = Field(..., description="Name of that branch.", examples=["Central Library"])
    checked_out_at: datetime = Field(..., description="Checkout time (UTC).")
    due_at: datetime = Field(..., description="Due time (UTC).")
    returned_at: Optional[datetime] = Field(None, description="Return time (UTC), null while on loan.")
    return_branch_id: Optional[int] = Field(None, description="Branch where the copy was returned.")
    renewals: int = Field(..., description="Number of renewals used (max 2).", examples=[0])
    status: str = Field(..., description="active, returned or lost.", examples=["active"])


class LoanListResponse(BaseModel):
    loans: List[LoanModel] = Field(..., description="Loans of the member.")
    count: int = Field(..., description="Number of loans returned.", examples=[5])


class LoanResponse(BaseModel):
    loan: LoanModel = Field(..., description="The loan after the operation.")
    message: str = Field(..., description="Human readable result.", examples=["Checked out."])


class CheckoutBody(BaseModel):
    copy_id: int = Field(..., description="ID of the available copy to check out.", examples=[1])


class RenewLoanBody(BaseModel):
    days: int = Field(14, description="Number of days to extend the due date by (1-21).", examples=[14])


class ReturnLoanBody(BaseModel):
    return_branch_id: int = Field(..., description="ID of the branch where the copy is dropped off.", examples=[2])


class HoldModel(BaseModel):
    id: int = Field(..., description="Hold ID.", examples=[1])
    book_id: int = Field(..., description="Book ID.", examples=[5])
    book_title: str = Field(..., description="Book title.", examples=["Dune"])
    pickup_branch_id: int = Field(..., description="Pickup branch ID.", examples=[2])
    pickup_branch_name: str = Field(..., description="Pickup branch name.", examples=["Riverside Branch"])
    status: str = Field(..., description="waiting, ready, fulfilled or cancelled.", examples=["waiting"])
    placed_at: datetime = Field(..., description="When the hold was placed (UTC); it fixes the queue position.")
    expires_at: Optional[datetime] = Field(None, description="Pickup deadline once ready.")
    notes: Optional[str] = Field(None, description="Member notes.")
    queue_position: Optional[int] = Field(None, description="Position among waiting holds on the book.", examples=[2])


class HoldListResponse(BaseModel):
    holds: List[HoldModel] = Field(..., description="Holds of the member.")
    count: int = Field(..., description="Number of holds returned.", examples=[2])


class HoldResponse(BaseModel):
    hold: HoldModel = Field(..., description="The hold after the operation.")
    message: str = Field(..., description="Human readable result.", examples=["Hold placed."])


class HoldCreateBody(BaseModel):
    book_id: int = Field(..., description="ID of the book to reserve.", examples=[4])
    pickup_branch_id: int = Field(..., description="ID of the branch to pick the book up at.", examples=[3])
    notes: Optional[str] = Field(None, description="Optional note for staff.")


class HoldUpdateBody(BaseModel):
    pickup_branch_id: Optional[int] = Field(None, description="New pickup branch ID.", examples=[2])
    notes: Optional[str] = Field(None, description="New note for staff.")


class FineModel(BaseModel):
    id: int = Field(..., description="Fine ID.", examples=[1])
    loan_id: Optional[int] = Field(None, description="Loan the fine relates to, if any.", examples=[6])
    book_title: Optional[str] = Field(None, description="Title of the book of that loan.", examples=["Circe"])
    amount: float = Field(..., description="Amount in dollars.", examples=[1.75])
    reason: str = Field(..., description="Why the fine was issued.")
    status: str = Field(..., description="unpaid, paid or waived.", examples=["unpaid"])
    issued_at: Optional[datetime] = Field(None, description="Issue time (UTC).")
    paid_at: Optional[datetime] = Field(None, description="Payment time (UTC).")
    payment_method: Optional[str] = Field(None, description="card, cash or account_credit.")


class FineListResponse(BaseModel):
    fines: List[FineModel] = Field(..., description="Fines of the member.")
    count: int = Field(..., description="Number of fines returned.", examples=[2])
    total_amount: float = Field(..., description="Sum of the amounts of the returned fines.", examples=[4.75])


class FineResponse(BaseModel):
    fine: FineModel = Field(..., description="The fine after the operation.")
    message: str = Field(..., description="Human readable result.", examples=["Fine paid."])


class PayFineBody(BaseModel):
    payment_method: str = Field(..., description="One of card, cash, account_credit.", examples=["card"])


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def book_summary(session, book: Book) -> BookSummaryModel:
    total = session.query(func.count(Copy.id)).filter(Copy.book_id == book.id).scalar() or 0
    available = (
        session.query(func.count(Copy.id)).filter(Copy.book_id == book.id, Copy.status == "available").scalar() or 0
    )
    return BookSummaryModel(
        id=book.id,
        title=book.title,
        author=book.author,
        isbn=book.isbn,
        genre=book.genre,
        publication_year=book.publication_year,
        total_copies=total,
        available_copies=available,
    )


def loan_model(session, loan: Loan) -> LoanModel:
    copy = session.query(Copy).filter(Copy.id == loan.copy_id).first()
    book = session.query(Book).filter(Book.id == copy.book_id).first()
    branch = session.query(Branch).filter(Branch.id == copy.branch_id).first()
    return LoanModel(
        id=loan.id,
        copy_id=copy.id,
        book_id=book.id,
        book_title=book.title,
        barcode=copy.barcode,
        branch_id=copy.branch_id,
        branch_name=branch.name if branch else "",
        checked_out_at=loan.checked_out_at,
        due_at=loan.due_at,
        returned_at=loan.returned_at,
        return_branch_id=loan.return_branch_id,
        renewals=loan.renewals,
        status=loan.status,
    )


def hold_model(session, hold: Hold) -> HoldModel:
    book = session.query(Book).filter(Book.id == hold.book_id).first()
    branch = session.query(Branch).filter(Branch.id == hold.pickup_branch_id).first()
    position = None
    if hold.status == "waiting":
        queue = (
            session.query(Hold)
            .filter(Hold.book_id == hold.book_id, Hold.status == "waiting")
            .order_by(Hold.placed_at.asc(), Hold.id.asc())
            .all()
        )
        for idx, h in enumerate(queue):
            if h.id == hold.id:
                position = idx + 1
    return HoldModel(
        id=hold.id,
        book_id=hold.book_id,
        book_title=book.title if book else "",
        pickup_branch_id=hold.pickup_branch_id,
        pickup_branch_name=branch.name if branch else "",
        status=hold.status,
        placed_at=hold.placed_at,
        expires_at=hold.expires_at,
        notes=hold.notes,
        queue_position=position,
    )


def fine_model(session, fine: Fine) -> FineModel:
    title = None
    if fine.loan_id is not None:
        row = (
            session.query(Book.title)
            .join(Copy, Copy.book_id == Book.id)
            .join(Loan, Loan.copy_id == Copy.id)
            .filter(Loan.id == fine.loan_id)
            .first()
        )
        title = row[0] if row else None
    return FineModel(
        id=fine.id,
        loan_id=fine.loan_id,
        book_title=title,
        amount=round(fine.amount, 2),
        reason=fine.reason,
        status=fine.status,
        issued_at=fine.issued_at,
        paid_at=fine.paid_at,
        payment_method=fine.payment_method,
    )


def member_model(session, member: Member) -> MemberModel:
    branch = session.query(Branch).filter(Branch.id == member.home_branch_id).first()
    active = (
        session.query(func.count(Loan.id)).filter(Loan.member_id == member.id, Loan.status == "active").scalar() or 0
    )
    unpaid = (
        session.query(func.sum(Fine.amount)).filter(Fine.member_id == member.id, Fine.status == "unpaid").scalar()
        or 0.0
    )
    return MemberModel(
        id=member.id,
        full_name=member.full_name,
        email=member.email,
        card_number=member.card_number,
        home_branch_id=member.home_branch_id,
        home_branch_name=branch.name if branch else None,
        status=member.status,
        max_loans=member.max_loans,
        active_loans=active,
        unpaid_fines_total=round(unpaid, 2),
        created_at=member.created_at,
    )


def get_own_loan(session, loan_id: int) -> Loan:
    loan = session.query(Loan).filter(Loan.id == loan_id, Loan.member_id == CURRENT_MEMBER_ID).first()
    if loan is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Loan {loan_id} not found for the current member.")
    return loan


# ---------------------------------------------------------------------------
# Catalogue
# ---------------------------------------------------------------------------


@app.get(
    "/api/books",
    response_model=BookSearchResponse,
    summary="Search the catalogue",
    description="Search books by a case-insensitive partial match on title or author, optionally filtered by "
    "genre. Each result carries total and available copy counts across all branches.",
    tags=["catalogue"],
    operation_id="search_books",
)
async def search_books(
    query: Optional[str] = Query(None, description="Text to match in the title or author.", examples=["Dune"]),
    genre: Optional[str] = Query(None, description="Exact genre filter (case-insensitive).", examples=["Science Fiction"]),
    limit: int = Query(20, description="Maximum number of books to return.", ge=1, le=100),
) -> BookSearchResponse:
    session = SessionLocal()
    q = session.query(Book)
    if query:
        pattern = f"%{query.strip()}%"
        q = q.filter((Book.title.ilike(pattern)) | (Book.author.ilike(pattern)))
    if genre:
        q = q.filter(func.lower(Book.genre) == genre.strip().lower())
    books = q.order_by(Book.title.asc()).limit(limit).all()
    results = [book_summary(session, b) for b in books]
    session.close()
    return BookSearchResponse(books=results, count=len(results))


@app.get(
    "/api/books/{book_id}",
    response_model=BookDetailResponse,
    summary="Get a book with its copies",
    description="Return one book with every copy the library owns: branch, barcode, shelf location and status.",
    tags=["catalogue"],
    operation_id="get_book_details",
)
async def get_book_details(
    book_id: int = Path(..., description="Book ID.", examples=[8]),
) -> BookDetailResponse:
    session = SessionLocal()
    book = session.query(Book).filter(Book.id == book_id).first()
    if book is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Book {book_id} not found.")
    rows = (
        session.query(Copy, Branch)
        .join(Branch, Copy.branch_id == Branch.id)
        .filter(Copy.book_id == book_id)
        .order_by(Branch.name.asc(), Copy.barcode.asc())
        .all()
    )
    copies = [
        CopyModel(
            id=c.id,
            barcode=c.barcode,
            branch_id=br.id,
            branch_name=br.name,
            status=c.status,
            shelf_location=c.shelf_location,
        )
        for c, br in rows
    ]
    summary = book_summary(session, book)
    session.close()
    return BookDetailResponse(book=summary, copies=copies)


@app.get(
    "/api/branches",
    response_model=BranchListResponse,
    summary="List library branches",
    description="Return every branch of the library system with its address and opening hours.",
    tags=["branches"],
    operation_id="list_branches",
)
async def list_branches() -> BranchListResponse:
    session = SessionLocal()
    branches = session.query(Branch).order_by(Branch.id.asc()).all()
    result = [BranchModel.model_validate(b) for b in branches]
    session.close()
    return BranchListResponse(branches=result)


# ---------------------------------------------------------------------------
# Account
# ---------------------------------------------------------------------------


@app.get(
    "/api/members/me",
    response_model=MemberModel,
    summary="Get my library account",
    description="Return the logged-in member's account: home branch, loan limit, active loan count and unpaid "
    "fine total.",
    tags=["account"],
    operation_id="get_my_account",
)
async def get_my_account() -> MemberModel:
    session = SessionLocal()
    member = session.query(Member).filter(Member.id == CURRENT_MEMBER_ID).first()
    if member is None:
        session.close()
        raise HTTPException(status_code=404, detail="Current member not found.")
    result = member_model(session, member)
    session.close()
    return result


@app.patch(
    "/api/members/me",
    response_model=MemberModel,
    summary="Update my library account",
    description="Change the logged-in member's contact email and/or home branch. Fields left out stay unchanged.",
    tags=["account"],
    operation_id="update_my_account",
)
async def update_my_account(
    body: MemberUpdateBody = Body(..., description="Fields to change."),
) -> MemberModel:
    session = SessionLocal()
    member = session.query(Member).filter(Member.id == CURRENT_MEMBER_ID).first()
    if member is None:
        session.close()
        raise HTTPException(status_code=404, detail="Current member not found.")
    if body.email is not None:
        email = body.email.strip()
        if "@" not in email:
            session.close()
            raise HTTPException(status_code=400, detail="email must be a valid address.")
        taken = session.query(Member).filter(Member.email == email, Member.id != member.id).first()
        if taken is not None:
            session.close()
            raise HTTPException(status_code=409, detail="That email is used by another member.")
        member.email = email
    if body.home_branch_id is not None:
        branch = session.query(Branch).filter(Branch.id == body.home_branch_id).first()
        if branch is None:
            session.close()
            raise HTTPException(status_code=404, detail=f"Branch {body.home_branch_id} not found.")
        member.home_branch_id = branch.id
    session.commit()
    result = member_model(session, member)
    session.close()
    return result


# ---------------------------------------------------------------------------
# Loans
# ---------------------------------------------------------------------------


@app.get(
    "/api/loans",
    response_model=LoanListResponse,
    summary="List my loans",
    description="Return the logged-in member's loans, current and past, ordered by due date. Filter by status "
    "(active, returned, lost) to see only current checkouts.",
    tags=["loans"],
    operation_id="list_my_loans",
)
async def list_my_loans(
    status: Optional[str] = Query(None, description="Loan status filter: active, returned or lost.", examples=["active"]),
) -> LoanListResponse:
    session = SessionLocal()
    q = session.query(Loan).filter(Loan.member_id == CURRENT_MEMBER_ID)
    if status:
        q = q.filter(Loan.status == status.strip().lower())
    loans = q.order_by(Loan.due_at.asc(), Loan.id.asc()).all()
    result = [loan_model(session, ln) for ln in loans]
    session.close()
    return LoanListResponse(loans=result, count=len(result))


@app.post(
    "/api/loans",
    response_model=LoanResponse,
    summary="Check out a copy",
    description="Borrow one specific available copy for the standard 21-day loan period. Fails with 409 when the "
    "copy is not available or the member has reached the loan limit.",
    tags=["loans"],
    operation_id="checkout_copy",
)
async def checkout_copy(
    body: CheckoutBody = Body(..., description="Copy to borrow."),
) -> LoanResponse:
    session = SessionLocal()
    member = session.query(Member).filter(Member.id == CURRENT_MEMBER_ID).first()
    copy = session.query(Copy).filter(Copy.id == body.copy_id).first()
    if copy is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Copy {body.copy_id} not found.")
    if member is None or member.status != "active":
        session.close()
        raise HTTPException(status_code=409, detail="Membership is not active.")
    if copy.status != "available":
        session.close()
        raise HTTPException(status_code=409, detail=f"Copy {copy.barcode} is not available (status: {copy.status}).")
    active = (
        session.query(func.count(Loan.id)).filter(Loan.member_id == member.id, Loan.status == "active").scalar() or 0
    )
    if active >= member.max_loans:
        session.close()
        raise HTTPException(status_code=409, detail=f"Loan limit of {member.max_loans} reached.")
    now = utc_now()
    loan = Loan(
        copy_id=copy.id,
        member_id=member.id,
        checked_out_at=now,
        due_at=now + timedelta(days=LOAN_PERIOD_DAYS),
        returned_at=None,
        return_branch_id=None,
        renewals=0,
        status="active",
    )
    copy.status = "on_loan"
    session.add(loan)
    session.commit()
    result = loan_model(session, loan)
    session.close()
    return LoanResponse(loan=result, message=f"Checked out copy {result.barcode}.")


@app.post(
    "/api/loans/{loan_id}/renew",
    response_model=LoanResponse,
    summary="Renew a loan",
    description="Extend the due date of one of my active loans by the given number of days (1-21). A loan can be "
    "renewed at most twice and not while another member is waiting for the book.",
    tags=["loans"],
    operation_id="renew_loan",
)
async def renew_loan(
    loan_id: int = Path(..., description="Loan ID to renew.", examples=[1]),
    body: RenewLoanBody = Body(..., description="Renewal length."),
) -> LoanResponse:
    session = SessionLocal()
    loan = get_own_loan(session, loan_id)
    if body.days < 1 or body.days > 21:
        session.close()
        raise HTTPException(status_code=400, detail="days must be between 1 and 21.")
    if loan.status != "active":
        session.close()
        raise HTTPException(status_code=409, detail="Only active loans can be renewed.")
    if loan.renewals >= MAX_RENEWALS:
        session.close()
        raise HTTPException(status_code=409, detail="This loan has already been renewed the maximum number of times.")
    copy = session.query(Copy).filter(Copy.id == loan.copy_id).first()
    waiting = (
        session.query(Hold)
        .filter(Hold.book_id == copy.book_id, Hold.status == "waiting", Hold.member_id != CURRENT_MEMBER_ID)
        .first()
    )
    if waiting is not None:
        session.close()
        raise HTTPException(status_code=409, detail="Another member is waiting for this book; it cannot be renewed.")
    loan.due_at = loan.due_at + timedelta(days=body.days)
    loan.renewals = loan.renewals + 1
    session.commit()
    result = loan_model(session, loan)
    session.close()
    return LoanResponse(loan=result, message=f"Renewed for {body.days} days.")


@app.post(
    "/api/loans/{loan_id}/return",
    response_model=LoanResponse,
    summary="Return a borrowed copy",
    description="Close one of my active loans. The copy becomes available and belongs to the branch where it was "
    "dropped off.",
    tags=["loans"],
    operation_id="return_loan",
)
async def return_loan(
    loan_id: int = Path(..., description="Loan ID to close.", examples=[2]),
    body: ReturnLoanBody = Body(..., description="Drop-off branch."),
) -> LoanResponse:
    session = SessionLocal()
    loan = get_own_loan(session, loan_id)
    if loan.status != "active":
        session.close()
        raise HTTPException(status_code=409, detail="This loan is not active.")
    branch = session.query(Branch).filter(Branch.id == body.return_branch_id).first()
    if branch is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Branch {body.return_branch_id} not found.")
    copy = session.query(Copy).filter(Copy.id == loan.copy_id).first()
    loan.returned_at = utc_now()
    loan.return_branch_id = branch.id
    loan.status = "returned"
    copy.status = "available"
    copy.branch_id = branch.id
    session.commit()
    result = loan_model(session, loan)
    session.close()
    return LoanResponse(loan=result, message=f"Returned at {branch.name}.")


# ---------------------------------------------------------------------------
# Holds
# ---------------------------------------------------------------------------


@app.get(
    "/api/holds",
    response_model=HoldListResponse,
    summary="List my holds",
    description="Return the logged-in member's holds with pickup branch and queue position.",
    tags=["holds"],
    operation_id="list_my_holds",
)
async def list_my_holds(
    status: Optional[str] = Query(None, description="Hold status filter: waiting, ready, fulfilled, cancelled."),
) -> HoldListResponse:
    session = SessionLocal()
    q = session.query(Hold).filter(Hold.member_id == CURRENT_MEMBER_ID)
    if status:
        q = q.filter(Hold.status == status.strip().lower())
    holds = q.order_by(Hold.placed_at.desc(), Hold.id.desc()).all()
    result = [hold_model(session, h) for h in holds]
    session.close()
    return HoldListResponse(holds=result, count=len(result))


@app.post(
    "/api/holds",
    response_model=HoldResponse,
    summary="Place a hold",
    description="Reserve a book for pickup at a branch. The hold joins the end of the book's waiting queue. Fails "
    "with 409 if I already have an active hold on the book.",
    tags=["holds"],
    operation_id="place_hold",
)
async def place_hold(
    body: HoldCreateBody = Body(..., description="Book and pickup branch."),
) -> HoldResponse:
    session = SessionLocal()
    book = session.query(Book).filter(Book.id == body.book_id).first()
    if book is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Book {body.book_id} not found.")
    branch = session.query(Branch).filter(Branch.id == body.pickup_branch_id).first()
    if branch is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Branch {body.pickup_branch_id} not found.")
    existing = (
        session.query(Hold)
        .filter(
            Hold.member_id == CURRENT_MEMBER_ID,
            Hold.book_id == book.id,
            Hold.status.in_(ACTIVE_HOLD_STATUSES),
        )
        .first()
    )
    if existing is not None:
        session.close()
        raise HTTPException(status_code=409, detail=f"You already have an active hold (id {existing.id}) on this book.")
    hold = Hold(
        book_id=book.id,
        member_id=CURRENT_MEMBER_ID,
        pickup_branch_id=branch.id,
        status="waiting",
        placed_at=utc_now(),
        expires_at=None,
        notes=body.notes,
    )
    session.add(hold)
    session.commit()
    result = hold_model(session, hold)
    session.close()
    return HoldResponse(hold=result, message="Hold placed.")


@app.put(
    "/api/holds/{hold_id}",
    response_model=HoldResponse,
    summary="Update a hold",
    description="Change the pickup branch or note of one of my waiting holds. The hold keeps its place in the "
    "queue.",
    tags=["holds"],
    operation_id="update_hold",
)
async def update_hold(
    hold_id: int = Path(..., description="Hold ID.", examples=[1]),
    body: HoldUpdateBody = Body(..., description="Fields to change."),
) -> HoldResponse:
    session = SessionLocal()
    hold = session.query(Hold).filter(Hold.id == hold_id, Hold.member_id == CURRENT_MEMBER_ID).first()
    if hold is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Hold {hold_id} not found.")
    if hold.status != "waiting":
        session.close()
        raise HTTPException(status_code=409, detail=f"Only waiting holds can be changed (status: {hold.status}).")
    if body.pickup_branch_id is not None:
        branch = session.query(Branch).filter(Branch.id == body.pickup_branch_id).first()
        if branch is None:
            session.close()
            raise HTTPException(status_code=404, detail=f"Branch {body.pickup_branch_id} not found.")
        hold.pickup_branch_id = branch.id
    if body.notes is not None:
        hold.notes = body.notes
    session.commit()
    result = hold_model(session, hold)
    session.close()
    return HoldResponse(hold=result, message="Hold updated.")


@app.delete(
    "/api/holds/{hold_id}",
    response_model=HoldResponse,
    summary="Cancel a hold",
    description="Cancel one of my waiting or ready holds. The hold is kept in history with status cancelled.",
    tags=["holds"],
    operation_id="cancel_hold",
)
async def cancel_hold(
    hold_id: int = Path(..., description="Hold ID.", examples=[1]),
) -> HoldResponse:
    session = SessionLocal()
    hold = session.query(Hold).filter(Hold.id == hold_id, Hold.member_id == CURRENT_MEMBER_ID).first()
    if hold is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Hold {hold_id} not found.")
    if hold.status not in ACTIVE_HOLD_STATUSES:
        session.close()
        raise HTTPException(status_code=409, detail=f"Hold is already {hold.status}.")
    hold.status = "cancelled"
    session.commit()
    result = hold_model(session, hold)
    session.close()
    return HoldResponse(hold=result, message="Hold cancelled.")


# ---------------------------------------------------------------------------
# Fines
# ---------------------------------------------------------------------------


@app.get(
    "/api/fines",
    response_model=FineListResponse,
    summary="List my fines",
    description="Return the logged-in member's fines (unpaid, paid and waived) with the total of those returned.",
    tags=["fines"],
    operation_id="list_my_fines",
)
async def list_my_fines(
    status: Optional[str] = Query(None, description="Fine status filter: unpaid, paid or waived.", examples=["unpaid"]),
) -> FineListResponse:
    session = SessionLocal()
    q = session.query(Fine).filter(Fine.member_id == CURRENT_MEMBER_ID)
    if status:
        q = q.filter(Fine.status == status.strip().lower())
    fines = q.order_by(Fine.issued_at.desc(), Fine.id.desc()).all()
    result = [fine_model(session, f) for f in fines]
    total = round(sum(f.amount for f in fines), 2)
    session.close()
    return FineListResponse(fines=result, count=len(result), total_amount=total)


@app.post(
    "/api/fines/{fine_id}/pay",
    response_model=FineResponse,
    summary="Pay a fine",
    description="Pay one of my unpaid fines in full with card, cash or account_credit.",
    tags=["fines"],
    operation_id="pay_fine",
)
async def pay_fine(
    fine_id: int = Path(..., description="Fine ID.", examples=[1]),
    body: PayFineBody = Body(..., description="Payment method."),
) -> FineResponse:
    session = SessionLocal()
    fine = session.query(Fine).filter(Fine.id == fine_id, Fine.member_id == CURRENT_MEMBER_ID).first()
    if fine is None:
        session.close()
        raise HTTPException(status_code=404, detail=f"Fine {fine_id} not found.")
    method = body.payment_method.strip().lower()
    if method not in PAYMENT_METHODS:
        session.close()
        raise HTTPException(status_code=400, detail="payment_method must be card, cash or account_credit.")
    if fine.status != "unpaid":
        session.close()
        raise HTTPException(status_code=409, detail=f"Fine is already {fine.status}.")
    fine.status = "paid"
    fine.payment_method = method
    fine.paid_at = utc_now()
    session.commit()
    result = fine_model(session, fine)
    session.close()
    return FineResponse(fine=result, message=f"Paid ${result.amount:.2f} by {method}.")


if __name__ == "__main__":
    import uvicorn

    host = os.getenv("HOST", "127.0.0.1")
    port = int(os.getenv("PORT", "8000"))
    uvicorn.run(app, host=host, port=port)
