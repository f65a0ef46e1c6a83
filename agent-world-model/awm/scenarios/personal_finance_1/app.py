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

database_url = os.getenv("DATABASE_PATH", "sqlite:///outputs/databases/personal_finance_1.db")

engine = create_engine(database_url, connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(bind=engine, autoflush=False, autocommit=False)

Base = declarative_base()

ACCOUNT_TYPES = ("checking", "savings", "credit")
FREQUENCIES = ("once", "weekly", "monthly")
SCHEDULE_STATUSES = ("active", "paused", "cancelled")


class User(Base):
    __tablename__ = "users"
    id = Column(Integer, primary_key=True)
    full_name = Column(String, nullable=False)
    email = Column(String, nullable=False, unique=True)
    phone = Column(String)
    created_at = Column(DateTime, server_default=func.current_timestamp())


class Account(Base):
    __tablename__ = "accounts"
    __table_args__ = (
        CheckConstraint("account_type IN ('checking', 'savings', 'credit')"),
        CheckConstraint("status IN ('open', 'closed')"),
    )
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, ForeignKey("users.id"), nullable=False, index=True)
    name = Column(String, nullable=False)
    account_type = Column(String, nullable=False)
    account_number_last4 = Column(String, nullable=False)
    balance = Column(Float, nullable=False, default=0)
    currency = Column(String, nullable=False, default="USD")
    status = Column(String, nullable=False, default="open")
    created_at = Column(DateTime, server_default=func.current_timestamp())
    updated_at = Column(DateTime, server_default=func.current_timestamp())


class Payee(Base):
    __tablename__ = "payees"
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, ForeignKey("users.id"), nullable=False, index=True)
    name = Column(String, nullable=False)
    category = Column(String, nullable=False, default="General")
    account_number = Column(String)
    created_at = Column(DateTime, server_default=func.current_timestamp())


class Transfer(Base):
    __tablename__ = "transfers"
    __table_args__ = (
        CheckConstraint("amount > 0"),
        CheckConstraint("status IN ('completed', 'reversed')"),
        CheckConstraint("from_account_id <> to_account_id"),
    )
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, ForeignKey("users.id"), nullable=False, index=True)
    from_account_id = Column(Integer, ForeignKey("accounts.id"), nullable=False)
    to_account_id = Column(Integer, ForeignKey("accounts.id"), nullable=False)
    amount = Column(Float, nullable=False)
    memo = Column(Text)
    status = Column(String, nullable=False, default="completed")
    reversal_reason = Column(Text)
    reversed_at = Column(DateTime)
    created_at = Column(DateTime, server_default=func.current_timestamp())


class Transaction(Base):
    __tablename__ = "transactions"
    id = Column(Integer, primary_key=True)
    account_id = Column(Integer, ForeignKey("accounts.id"), nullable=False)
    amount = Column(Float, nullable=False)
    description = Column(Text, nullable=False)
    category = Column(String, nullable=False, default="Uncategorized")
    payee_id = Column(Integer, ForeignKey("payees.id"))
    transfer_id = Column(Integer, ForeignKey("transfers.id"))
    posted_at = Column(DateTime, nullable=False, server_default=func.current_timestamp())
    created_at = Column(DateTime, server_default=func.current_timestamp())
    updated_at = Column(DateTime, server_default=func.current_timestamp())


class Budget(Base):
    __tablename__ = "budgets"
    __table_args__ = (
        UniqueConstraint("user_id", "category"),
        CheckConstraint("monthly_limit >= 0"),
        CheckConstraint("alert_threshold_pct BETWEEN 1 AND 100"),
    )
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, ForeignKey("users.id"), nullable=False)
    category = Column(String, nullable=False)
    monthly_limit = Column(Float, nullable=False)
    alert_threshold_pct = Column(Integer, nullable=False, default=80)
    created_at = Column(DateTime, server_default=func.current_timestamp())
    updated_at = Column(DateTime, server_default=func.current_timestamp())


class ScheduledPayment(Base):
    __tablename__ = "scheduled_payments"
    __table_args__ = (
        CheckConstraint("amount > 0"),
        CheckConstraint("frequency IN ('once', 'weekly', 'monthly')"),
        CheckConstraint("status IN ('active', 'paused', 'cancelled')"),
    )
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, ForeignKey("users.id"), nullable=False)
    account_id = Column(Integer, ForeignKey("accounts.id"), nullable=False)
    payee_id = Column(Integer, ForeignKey("payees.id"), nullable=False)
    amount = Column(Float, nullable=False)
    frequency = Column(String, nullable=False)
    next_run_date = Column(Date, nullable=False)
    status = Column(String, nullable=False, default="active")
    memo = Column(Text)
    created_at = Column(DateTime, server_default=func.current_timestamp())
    updated_at = Column(DateTime, server_default=func.current_timestamp())


Index("idx_transactions_account_posted", Transaction.account_id, Transaction.posted_at)
Index("idx_transactions_payee", Transaction.payee_id)
Index("idx_transactions_category", Transaction.category)
Index("idx_transfers_from_account", Transfer.from_account_id)
Index("idx_transfers_to_account", Transfer.to_account_id)
Index("idx_payees_user_name", Payee.user_id, Payee.name)
Index("idx_scheduled_payments_user_status", ScheduledPayment.user_id, ScheduledPayment.status)
Index("idx_scheduled_payments_next_run", ScheduledPayment.next_run_date)

Base.metadata.create_all(engine)

app = FastAPI(
    title="ClearLedger Personal Banking API",
    version="1.0.0",
    description="Accounts, payees, transactions, transfers, budgets and scheduled payments of the signed-in customer.",
)


def now_utc() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def money(value: float) -> float:
    return round(float(value), 2)


# ---------------------------------------------------------------------------
# Pydantic schemas
# ---------------------------------------------------------------------------


class AccountModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Account ID.", examples=[1])
    name: str = Field(..., description="Account nickname.", examples=["Everyday Checking"])
    account_type: str = Field(..., description="checking, savings or credit.", examples=["checking"])
    account_number_last4: str = Field(..., description="Last four digits of the account number.", examples=["4821"])
    balance: float = Field(..., description="Current balance; negative on a credit account means money owed.", examples=[3120.45])
    currency: str = Field(..., description="ISO currency code.", examples=["USD"])
    status: str = Field(..., description="open or closed.", examples=["open"])
    created_at: Optional[datetime] = Field(None, description="When the account was opened.")


class AccountListResponse(BaseModel):
    accounts: List[AccountModel] = Field(..., description="Accounts of the signed-in user.")


class TransactionModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Transaction ID.", examples=[12])
    account_id: int = Field(..., description="Account the transaction was posted to.", examples=[1])
    amount: float = Field(..., description="Signed amount: negative for money out, positive for money in.", examples=[-54.15])
    description: str = Field(..., description="Statement description.", examples=["FreshMart Groceries #112"])
    category: str = Field(..., description="Spending category.", examples=["Groceries"])
    payee_id: Optional[int] = Field(None, description="Payee ID when the transaction is linked to a saved payee.", examples=[1])
    payee_name: Optional[str] = Field(None, description="Payee name when linked.", examples=["FreshMart Groceries"])
    transfer_id: Optional[int] = Field(None, description="Transfer ID when the transaction belongs to a transfer.", examples=[None])
    posted_at: Optional[datetime] = Field(None, description="When the transaction posted.")


class TransactionListResponse(BaseModel):
    account_id: int = Field(..., description="Account whose transactions are listed.", examples=[1])
    transactions: List[TransactionModel] = Field(..., description="Matching transactions, newest first.")
    total_amount: float = Field(..., description="Sum of the signed amounts of the returned transactions.", examples=[-182.35])


class TransactionCategoryUpdateBody(BaseModel):
    category: str = Field(..., description="New spending category for the transaction.", examples=["Dining"])


class TransactionResponse(BaseModel):
    transaction: TransactionModel = Field(..., description="The updated transaction.")


class PayeeModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Payee ID.", examples=[3])
    name: str = Field(..., description="Payee name.", examples=["Oakridge Property Management"])
    category: str = Field(..., description="Default category for payments to this payee.", examples=["Housing"])
    account_number: Optional[str] = Field(None, description="Customer/account number at the payee.", examples=["OPM-7740"])
    created_at: Optional[datetime] = Field(None, description="When the payee was saved.")


class PayeeListResponse(BaseModel):
    payees: List[PayeeModel] = Field(..., description="Saved payees matching the filters.")


class PayeeCreateBody(BaseModel):
    name: str = Field(..., description="Payee name.", examples=["Greenway Solar"])
    category: str = Field("General", description="Default spending category.", examples=["Utilities"])
    account_number: Optional[str] = Field(None, description="Your customer/account number at the payee.", examples=["GS-88213"])


class PayeeResponse(BaseModel):
    payee: PayeeModel = Field(..., description="The payee.")


class StatusResponse(BaseModel):
    status: str = Field(..., description="Result of the operation.", examples=["deleted"])
    id: int = Field(..., description="ID of the affected record.", examples=[7])


class TransferModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Transfer ID.", examples=[4])
    from_account_id: int = Field(..., description="Source account ID.", examples=[1])
    from_account_name: Optional[str] = Field(None, description="Source account name.", examples=["Everyday Checking"])
    to_account_id: int = Field(..., description="Destination account ID.", examples=[2])
    to_account_name: Optional[str] = Field(None, description="Destination account name.", examples=["Emergency Fund"])
    amount: float = Field(..., description="Amount moved.", examples=[120.0])
    memo: Optional[str] = Field(None, description="Memo entered with the transfer.", examples=["Vacation Fund deposit"])
    status: str = Field(..., description="completed or reversed.", examples=["completed"])
    reversal_reason: Optional[str] = Field(None, description="Reason given when the transfer was reversed.")
    reversed_at: Optional[datetime] = Field(None, description="When the transfer was reversed.")
    created_at: Optional[datetime] = Field(None, description="When the transfer was made.")


class TransferListResponse(BaseModel):
    transfers: List[TransferModel] = Field(..., description="Transfers, newest first.")


class TransferCreateBody(BaseModel):
    from_account_id: int = Field(..., description="Account to move money from (checking or savings).", examples=[1])
    to_account_id: int = Field(..., description="Account to move money to.", examples=[2])
    amount: float = Field(..., description="Amount to move, greater than zero.", examples=[250.0])
    memo: Optional[str] = Field(None, description="Optional memo.", examples=["March top-up"])


class TransferReverseBody(BaseModel):
    reason: Optional[str] = Field(None, description="Why the transfer is being reversed.", examples=["Sent to the wrong account"])


class TransferResponse(BaseModel):
    transfer: TransferModel = Field(..., description="The transfer.")
    from_account_balance: float = Field(..., description="Source account balance after the operation.", examples=[2870.45])
    to_account_balance: float = Field(..., description="Destination account balance after the operation.", examples=[8650.0])


class BudgetModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Budget ID.", examples=[2])
    category: str = Field(..., description="Spending category the budget covers.", examples=["Dining"])
    monthly_limit: float = Field(..., description="Monthly spending limit.", examples=[250.0])
    alert_threshold_pct: int = Field(..., description="Percent of the limit at which an alert is sent.", examples=[80])
    updated_at: Optional[datetime] = Field(None, description="Last change.")


class BudgetListResponse(BaseModel):
    budgets: List[BudgetModel] = Field(..., description="Budgets of the signed-in user.")


class BudgetCreateBody(BaseModel):
    category: str = Field(..., description="Spending category.", examples=["Pets"])
    monthly_limit: float = Field(..., description="Monthly limit, zero or more.", examples=[150.0])
    alert_threshold_pct: int = Field(80, description="Alert threshold in percent (1-100).", examples=[75])


class BudgetUpdateBody(BaseModel):
    monthly_limit: float = Field(..., description="New monthly limit, zero or more.", examples=[200.0])
    alert_threshold_pct: Optional[int] = Field(None, description="New alert threshold in percent (1-100); unchanged when omitted.", examples=[90])


class BudgetResponse(BaseModel):
    budget: BudgetModel = Field(..., description="The budget.")


class ScheduledPaymentModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Scheduled payment ID.", examples=[2])
    account_id: int = Field(..., description="Account the payment is drawn from.", examples=[1])
    account_name: Optional[str] = Field(None, description="Name of that account.", examples=["Everyday Checking"])
    payee_id: int = Field(..., description="Payee ID.", examples=[2])
    payee_name: Optional[str] = Field(None, description="Payee name.", examples=["City Water Utility"])
    amount: float = Field(..., description="Amount of each payment.", examples=[62.0])
    frequency: str = Field(..., description="once, weekly or monthly.", examples=["monthly"])
    next_run_date: date = Field(..., description="Date of the next payment (YYYY-MM-DD).", examples=["2027-03-01"])
    status: str = Field(..., description="active, paused or cancelled.", examples=["active"])
    memo: Optional[str] = Field(None, description="Memo sent with each payment.", examples=["Water bill"])
    created_at: Optional[datetime] = Field(None, description="When the schedule was created.")


class ScheduledPaymentListResponse(BaseModel):
    scheduled_payments: List[ScheduledPaymentModel] = Field(..., description="Scheduled payments ordered by next run date.")


class ScheduledPaymentCreateBody(BaseModel):
    account_id: int = Field(..., description="Account to pay from.", examples=[1])
    payee_id: int = Field(..., description="Saved payee to pay.", examples=[9])
    amount: float = Field(..., description="Amount of each payment, greater than zero.", examples=[89.99])
    frequency: str = Field(..., description="once, weekly or monthly.", examples=["monthly"])
    next_run_date: date = Field(..., description="Date of the first payment (YYYY-MM-DD).", examples=["2027-03-01"])
    memo: Optional[str] = Field(None, description="Optional memo.", examples=["Solar lease"])


class ScheduledPaymentUpdateBody(BaseModel):
    amount: Optional[float] = Field(None, description="New amount.", examples=[70.0])
    frequency: Optional[str] = Field(None, description="New frequency: once, weekly or monthly.", examples=["monthly"])
    next_run_date: Optional[date] = Field(None, description="New next payment date (YYYY-MM-DD).", examples=["2027-03-15"])
    status: Optional[str] = Field(None, description="active or paused (use the delete endpoint to cancel).", examples=["paused"])
    memo: Optional[str] = Field(None, description="New memo.", examples=["Streaming"])


class ScheduledPaymentResponse(BaseModel):
    scheduled_payment: ScheduledPaymentModel = Field(..., description="The scheduled payment.")


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def transaction_to_model(session, txn: Transaction) -> TransactionModel:
    payee_name = None
    if txn.payee_id is not None:
        payee = session.query(Payee).filter(Payee.id == txn.payee_id).first()
        payee_name = payee.name if payee is not None else None
    return TransactionModel(
        id=txn.id,
        account_id=txn.account_id,
        amount=money(txn.amount),
        description=txn.description,
        category=txn.category,
        payee_id=txn.payee_id,
        payee_name=payee_name,
        transfer_id=txn.transfer_id,
        posted_at=txn.posted_at,
    )


def transfer_to_model(session, tr: Transfer) -> TransferModel:
    src = session.query(Account).filter(Account.id == tr.from_account_id).first()
    dst = session.query(Account).filter(Account.id == tr.to_account_id).first()
    return TransferModel(
        id=tr.id,
        from_account_id=tr.from_account_id,
        from_account_name=src.name if src is not None else None,
        to_account_id=tr.to_account_id,
        to_account_name=dst.name if dst is not None else None,
        amount=money(tr.amount),
        memo=tr.memo,
        status=tr.status,
        reversal_reason=tr.reversal_reason,
        reversed_at=tr.reversed_at,
        created_at=tr.created_at,
    )


def scheduled_to_model(session, sp: ScheduledPayment) -> ScheduledPaymentModel:
    acct = session.query(Account).filter(Account.id == sp.account_id).first()
    payee = session.query(Payee).filter(Payee.id == sp.payee_id).first()
    return ScheduledPaymentModel(
        id=sp.id,
        account_id=sp.account_id,
        account_name=acct.name if acct is not None else None,
        payee_id=sp.payee_id,
        payee_name=payee.name if payee is not None else None,
        amount=money(sp.amount),
        frequency=sp.frequency,
        next_run_date=sp.next_run_date,
        status=sp.status,
        memo=sp.memo,
        created_at=sp.created_at,
    )


def fail(session, status_code: int, detail: str):
    session.close()
    raise HTTPException(status_code=status_code, detail=detail)


# ---------------------------------------------------------------------------
# accounts and transactions
# ---------------------------------------------------------------------------


@app.get(
    "/api/accounts",
    response_model=AccountListResponse,
    summary="List my accounts",
    description="List the signed-in user's bank and card accounts with their current balances. Closed accounts are hidden unless include_closed is true.",
    tags=["accounts"],
    operation_id="list_accounts",
)
async def list_accounts(
    account_type: Optional[str] = Query(None, description="Filter by account type: checking, savings or credit."),
    include_closed: bool = Query(False, description="Also return closed accounts."),
) -> AccountListResponse:
    session = SessionLocal()
    user_id = 1
    q = session.query(Account).filter(Account.user_id == user_id)
    if account_type:
        q = q.filter(Account.account_type == account_type.lower())
    if not include_closed:
        q = q.filter(Account.status == "open")
    rows = q.order_by(Account.id.asc()).all()
    accounts = [AccountModel.model_validate(a) for a in rows]
    for a in accounts:
        a.balance = money(a.balance)
    session.close()
    return AccountListResponse(accounts=accounts)


@app.get(
    "/api/accounts/{account_id}/transactions",
    response_model=TransactionListResponse,
    summary="List transactions of an account",
    description="Return the transactions posted to one of my accounts, newest first, optionally filtered by category, payee or a text search on the description.",
    tags=["transactions"],
    operation_id="list_account_transactions",
)
async def list_account_transactions(
    account_id: int = Path(..., description="Account ID."),
    category: Optional[str] = Query(None, description="Only transactions in this category (case-insensitive)."),
    payee_id: Optional[int] = Query(None, description="Only transactions linked to this payee."),
    search: Optional[str] = Query(None, description="Case-insensitive text to find in the description."),
    limit: int = Query(50, description="Maximum number of transactions to return.", ge=1, le=200),
) -> TransactionListResponse:
    session = SessionLocal()
    user_id = 1
    acct = session.query(Account).filter(Account.id == account_id, Account.user_id == user_id).first()
    if acct is None:
        fail(session, 404, f"Account {account_id} not found")
    q = session.query(Transaction).filter(Transaction.account_id == account_id)
    if category:
        q = q.filter(func.lower(Transaction.category) == category.lower())
    if payee_id is not None:
        q = q.filter(Transaction.payee_id == payee_id)
    if search:
        q = q.filter(Transaction.description.ilike(f"%{search}%"))
    rows = q.order_by(Transaction.posted_at.desc(), Transaction.id.desc()).limit(limit).all()
    items = [transaction_to_model(session, t) for t in rows]
    total = money(sum(t.amount for t in items))
    session.close()
    return TransactionListResponse(account_id=account_id, transactions=items, total_amount=total)


@app.patch(
    "/api/transactions/{transaction_id}",
    response_model=TransactionResponse,
    summary="Recategorize a transaction",
    description="Change the spending category of one transaction on one of my accounts.",
    tags=["transactions"],
    operation_id="update_transaction_category",
)
async def update_transaction_category(
    transaction_id: int = Path(..., description="Transaction ID."),
    body: TransactionCategoryUpdateBody = Body(..., description="New category."),
) -> TransactionResponse:
    session = SessionLocal()
    user_id = 1
    txn = (
        session.query(Transaction)
        .join(Account, Transaction.account_id == Account.id)
        .filter(Transaction.id == transaction_id, Account.user_id == user_id)
        .first()
    )
    if txn is None:
        fail(session, 404, f"Transaction {transaction_id} not found")
    if not body.category.strip():
        fail(session, 400, "Category must not be empty")
    txn.category = body.category.strip()
    txn.updated_at = now_utc()
    session.commit()
    result = transaction_to_model(session, txn)
    session.close()
    return TransactionResponse(transaction=result)


# ---------------------------------------------------------------------------
# payees
# ---------------------------------------------------------------------------


@app.get(
    "/api/payees",
    response_model=PayeeListResponse,
    summary="Search saved payees",
    description="List my saved payees, optionally filtered by a partial name match or by category.",
    tags=["payees"],
    operation_id="search_payees",
)
async def search_payees(
    name: Optional[str] = Query(None, description="Case-insensitive partial payee name."),
    category: Optional[str] = Query(None, description="Only payees in this category (case-insensitive)."),
) -> PayeeListResponse:
    session = SessionLocal()
    user_id = 1
    q = session.query(Payee).filter(Payee.user_id == user_id)
    if name:
        q = q.filter(Payee.name.ilike(f"%{name}%"))
    if category:
        q = q.filter(func.lower(Payee.category) == category.lower())
    rows = q.order_by(Payee.name.asc()).all()
    payees = [PayeeModel.model_validate(p) for p in rows]
    session.close()
    return PayeeListResponse(payees=payees)


@app.post(
    "/api/payees",
    response_model=PayeeResponse,
    summary="Add a payee",
    description="Save a new payee for bill payments. A payee name can only be saved once.",
    tags=["payees"],
    operation_id="create_payee",
)
async def create_payee(
    body: PayeeCreateBody = Body(..., description="Payee to save."),
) -> PayeeResponse:
    session = SessionLocal()
    user_id = 1
    name = body.name.strip()
    if not name:
        fail(session, 400, "Payee name must not be empty")
    existing = (
        session.query(Payee)
        .filter(Payee.user_id == user_id, func.lower(Payee.name) == name.lower())
        .first()
    )
    if existing is not None:
        fail(session, 409, f"A payee named '{existing.name}' already exists (id {existing.id})")
    payee = Payee(
        user_id=user_id,
        name=name,
        category=body.category,
        account_number=body.account_number,
        created_at=now_utc(),
    )
    session.add(payee)
    session.commit()
    result = PayeeModel.model_validate(payee)
    session.close()
    return PayeeResponse(payee=result)


@app.delete(
    "/api/payees/{payee_id}",
    response_model=StatusResponse,
    summary="Delete a payee",
    description="Remove a saved payee. Payees that still have transactions or scheduled payments cannot be deleted.",
    tags=["payees"],
    operation_id="delete_payee",
)
async def delete_payee(
    payee_id: int = Path(..., description="Payee ID."),
) -> StatusResponse:
    session = SessionLocal()
    user_id = 1
    payee = session.query(Payee).filter(Payee.id == payee_id, Payee.user_id == user_id).first()
    if payee is None:
        fail(session, 404, f"Payee {payee_id} not found")
    used_txn = session.query(Transaction).filter(Transaction.payee_id == payee_id).count()
    used_sched = (
        session.query(ScheduledPayment)
        .filter(ScheduledPayment.payee_id == payee_id, ScheduledPayment.status != "cancelled")
        .count()
    )
    if used_txn or used_sched:
        fail(session, 409, "Payee has transactions or scheduled payments and cannot be deleted")
    session.query(ScheduledPayment).filter(ScheduledPayment.payee_id == payee_id).delete()
    session.delete(payee)
    session.commit()
    session.close()
    return StatusResponse(status="deleted", id=payee_id)


# ---------------------------------------------------------------------------
# transfers
# ---------------------------------------------------------------------------


@app.get(
    "/api/transfers",
    response_model=TransferListResponse,
    summary="List transfers between my accounts",
    description="List internal transfers, newest first, optionally only those touching one account or with a given status.",
    tags=["transfers"],
    operation_id="list_transfers",
)
async def list_transfers(
    account_id: Optional[int] = Query(None, description="Only transfers from or to this account."),
    status: Optional[str] = Query(None, description="completed or reversed."),
    limit: int = Query(50, description="Maximum number of transfers.", ge=1, le=200),
) -> TransferListResponse:
    session = SessionLocal()
    user_id = 1
    q = session.query(Transfer).filter(Transfer.user_id == user_id)
    if account_id is not None:
        q = q.filter((Transfer.from_account_id == account_id) | (Transfer.to_account_id == account_id))
    if status:
        q = q.filter(Transfer.status == status.lower())
    rows = q.order_by(Transfer.created_at.desc(), Transfer.id.desc()).limit(limit).all()
    items = [transfer_to_model(session, t) for t in rows]
    session.close()
    return TransferListResponse(transfers=items)


@app.post(
    "/api/transfers",
    response_model=TransferResponse,
    summary="Transfer money between my accounts",
    description="Move money from one of my open checking or savings accounts to another of my open accounts (a transfer to a credit account pays it down). Fails with 409 when the source balance is too low.",
    tags=["transfers"],
    operation_id="create_transfer",
)
async def create_transfer(
    body: TransferCreateBody = Body(..., description="Transfer details."),
) -> TransferResponse:
    session = SessionLocal()
    user_id = 1
    amount = money(body.amount)
    if amount <= 0:
        fail(session, 400, "Amount must be greater than zero")
    if body.from_account_id == body.to_account_id:
        fail(session, 400, "Source and destination accounts must differ")
    src = session.query(Account).filter(Account.id == body.from_account_id, Account.user_id == user_id).first()
    dst = session.query(Account).filter(Account.id == body.to_account_id, Account.user_id == user_id).first()
    if src is None or dst is None:
        fail(session, 404, "Source or destination account not found")
    if src.status != "open" or dst.status != "open":
        fail(session, 400, "Both accounts must be open")
    if src.account_type == "credit":
        fail(session, 400, "Transfers cannot be made from a credit account")
    if money(src.balance) < amount:
        fail(session, 409, f"Insufficient funds in '{src.name}': balance {money(src.balance):.2f}, requested {amount:.2f}")
    now = now_utc()
    tr = Transfer(
        user_id=user_id,
        from_account_id=src.id,
        to_account_id=dst.id,
        amount=amount,
        memo=body.memo,
        status="completed",
        created_at=now,
    )
    session.add(tr)
    session.flush()
    src.balance = money(src.balance - amount)
    dst.balance = money(dst.balance + amount)
    src.updated_at = now
    dst.updated_at = now
    session.add(Transaction(account_id=src.id, amount=-amount, description=f"Transfer to {dst.name}",
                            category="Transfer", transfer_id=tr.id, posted_at=now, created_at=now, updated_at=now))
    session.add(Transaction(account_id=dst.id, amount=amount, description=f"Transfer from {src.name}",
                            category="Transfer", transfer_id=tr.id, posted_at=now, created_at=now, updated_at=now))
    session.commit()
    result = TransferResponse(
        transfer=transfer_to_model(session, tr),
        from_account_balance=money(src.balance),
        to_account_balance=money(dst.balance),
    )
    session.close()
    return result


@app.post(
    "/api/transfers/{transfer_id}/reverse",
    response_model=TransferResponse,
    summary="Reverse a transfer",
    description="Undo a completed transfer: the amount goes back to the source account and the transfer is marked reversed. Fails with 409 if it was already reversed or the destination no longer holds the money.",
    tags=["transfers"],
    operation_id="reverse_transfer",
)
async def reverse_transfer(
    transfer_id: int = Path(..., description="Transfer ID."),
    body: TransferReverseBody = Body(..., description="Optional reason."),
) -> TransferResponse:
    session = SessionLocal()
    user_id = 1
    tr = session.query(Transfer).filter(Transfer.id == transfer_id, Transfer.user_id == user_id).first()
    if tr is None:
        fail(session, 404, f"Transfer {transfer_id} not found")
    if tr.status == "reversed":
        fail(session, 409, f"Transfer {transfer_id} was already reversed")
    src = session.query(Account).filter(Account.id == tr.from_account_id).first()
    dst = session.query(Account).filter(Account.id == tr.to_account_id).first()
    amount = money(tr.amount)
    if dst.account_type != "credit" and money(dst.balance) < amount:
        fail(session, 409, f"'{dst.name}' no longer holds {amount:.2f}; the transfer cannot be reversed")
    now = now_utc()
    src.balance = money(src.balance + amount)
    dst.balance = money(dst.balance - amount)
    src.updated_at = now
    dst.updated_at = now
    tr.status = "reversed"
    tr.reversal_reason = body.reason
    tr.reversed_at = now
    session.add(Transaction(account_id=dst.id, amount=-amount, description=f"Reversal of transfer #{tr.id} from {src.name}",
                            category="Transfer", transfer_id=tr.id, posted_at=now, created_at=now, updated_at=now))
    session.add(Transaction(account_id=src.id, amount=amount, description=f"Reversal of transfer #{tr.id} to {dst.name}",
                            category="Transfer", transfer_id=tr.id, posted_at=now, created_at=now, updated_at=now))
    session.commit()
    result = TransferResponse(
        transfer=transfer_to_model(session, tr),
        from_account_balance=money(src.balance),
        to_account_balance=money(dst.balance),
    )
    session.close()
    return result


# ---------------------------------------------------------------------------
# budgets
# ---------------------------------------------------------------------------


@app.get(
    "/api/budgets",
    response_model=BudgetListResponse,
    summary="List my budgets",
    description="List the monthly category budgets of the signed-in user.",
    tags=["budgets"],
    operation_id="list_budgets",
)
async def list_budgets(
    category: Optional[str] = Query(None, description="Only the budget of this category (case-insensitive)."),
) -> BudgetListResponse:
    session = SessionLocal()
    user_id = 1
    q = session.query(Budget).filter(Budget.user_id == user_id)
    if category:
        q = q.filter(func.lower(Budget.category) == category.lower())
    rows = q.order_by(Budget.category.asc()).all()
    budgets = [BudgetModel.model_validate(b) for b in rows]
    session.close()
    return BudgetListResponse(budgets=budgets)


@app.post(
    "/api/budgets",
    response_model=BudgetResponse,
    summary="Create a budget",
    description="Create a monthly budget for a spending category. Each category can have only one budget (409 otherwise).",
    tags=["budgets"],
    operation_id="create_budget",
)
async def create_budget(
    body: BudgetCreateBody = Body(..., description="Budget to create."),
) -> BudgetResponse:
    session = SessionLocal()
    user_id = 1
    category = body.category.strip()
    if not category:
        fail(session, 400, "Category must not be empty")
    if body.monthly_limit < 0 or not 1 <= body.alert_threshold_pct <= 100:
        fail(session, 400, "monthly_limit must be >= 0 and alert_threshold_pct between 1 and 100")
    existing = (
        session.query(Budget)
        .filter(Budget.user_id == user_id, func.lower(Budget.category) == category.lower())
        .first()
    )
    if existing is not None:
        fail(session, 409, f"A budget for '{existing.category}' already exists (id {existing.id})")
    now = now_utc()
    budget = Budget(
        user_id=user_id,
        category=category,
        monthly_limit=money(body.monthly_limit),
        alert_threshold_pct=body.alert_threshold_pct,
        created_at=now,
        updated_at=now,
    )
    session.add(budget)
    session.commit()
    result = BudgetModel.model_validate(budget)
    session.close()
    return BudgetResponse(budget=result)


@app.put(
    "/api/budgets/{budget_id}",
    response_model=BudgetResponse,
    summary="Update a budget",
    description="Set a new monthly limit (and optionally a new alert threshold) for one of my budgets.",
    tags=["budgets"],
    operation_id="update_budget",
)
async def update_budget(
    budget_id: int = Path(..., description="Budget ID."),
    body: BudgetUpdateBody = Body(..., description="New budget values."),
) -> BudgetResponse:
    session = SessionLocal()
    user_id = 1
    budget = session.query(Budget).filter(Budget.id == budget_id, Budget.user_id == user_id).first()
    if budget is None:
        fail(session, 404, f"Budget {budget_id} not found")
    if body.monthly_limit < 0:
        fail(session, 400, "monthly_limit must be >= 0")
    if body.alert_threshold_pct is not None and not 1 <= body.alert_threshold_pct <= 100:
        fail(session, 400, "alert_threshold_pct must be between 1 and 100")
    budget.monthly_limit = money(body.monthly_limit)
    if body.alert_threshold_pct is not None:
        budget.alert_threshold_pct = body.alert_threshold_pct
    budget.updated_at = now_utc()
    session.commit()
    result = BudgetModel.model_validate(budget)
    session.close()
    return BudgetResponse(budget=result)


# ---------------------------------------------------------------------------
# scheduled payments
# ---------------------------------------------------------------------------


@app.get(
    "/api/scheduled-payments",
    response_model=ScheduledPaymentListResponse,
    summary="List scheduled bill payments",
    description="List my recurring and one-off scheduled payments ordered by next run date, optionally by status.",
    tags=["scheduled_payments"],
    operation_id="list_scheduled_payments",
)
async def list_scheduled_payments(
    status: Optional[str] = Query(None, description="active, paused or cancelled."),
    payee_id: Optional[int] = Query(None, description="Only payments to this payee."),
) -> ScheduledPaymentListResponse:
    session = SessionLocal()
    user_id = 1
    q = session.query(ScheduledPayment).filter(ScheduledPayment.user_id == user_id)
    if status:
        q = q.filter(ScheduledPayment.status == status.lower())
    if payee_id is not None:
        q = q.filter(ScheduledPayment.payee_id == payee_id)
    rows = q.order_by(ScheduledPayment.next_run_date.asc(), ScheduledPayment.id.asc()).all()
    items = [scheduled_to_model(session, sp) for sp in rows]
    session.close()
    return ScheduledPaymentListResponse(scheduled_payments=items)


@app.post(
    "/api/scheduled-payments",
    response_model=ScheduledPaymentResponse,
    summary="Schedule a bill payment",
    description="Schedule a one-off, weekly or monthly payment from one of my open accounts to a saved payee.",
    tags=["scheduled_payments"],
    operation_id="create_scheduled_payment",
)
async def create_scheduled_payment(
    body: ScheduledPaymentCreateBody = Body(..., description="Payment schedule."),
) -> ScheduledPaymentResponse:
    session = SessionLocal()
    user_id = 1
    frequency = body.frequency.lower()
    if frequency not in FREQUENCIES:
        fail(session, 400, f"frequency must be one of {', '.join(FREQUENCIES)}")
    if body.amount <= 0:
        fail(session, 400, "Amount must be greater than zero")
    acct = session.query(Account).filter(Account.id == body.account_id, Account.user_id == user_id).first()
    if acct is None:
        fail(session, 404, f"Account {body.account_id} not found")
    if acct.status != "open":
        fail(session, 400, f"Account '{acct.name}' is closed")
    payee = session.query(Payee).filter(Payee.id == body.payee_id, Payee.user_id == user_id).first()
    if payee is None:
        fail(session, 404, f"Payee {body.payee_id} not found")
    now = now_utc()
    sp = ScheduledPayment(
        user_id=user_id,
        account_id=acct.id,
        payee_id=payee.id,
        amount=money(body.amount),
        frequency=frequency,
        next_run_date=body.next_run_date,
        status="active",
        memo=body.memo,
        created_at=now,
        updated_at=now,
    )
    session.add(sp)
    session.commit()
    result = scheduled_to_model(session, sp)
    session.close()
    return ScheduledPaymentResponse(scheduled_payment=result)


@app.patch(
    "/api/scheduled-payments/{payment_id}",
    response_model=ScheduledPaymentResponse,
    summary="Change or pause a scheduled payment",
    description="Update the amount, frequency, next date or memo of a scheduled payment, or pause/resume it with status active|paused.",
    tags=["scheduled_payments"],
    operation_id="update_scheduled_payment",
)
async def update_scheduled_payment(
    payment_id: int = Path(..., description="Scheduled payment ID."),
    body: ScheduledPaymentUpdateBody = Body(..., description="Fields to change."),
) -> ScheduledPaymentResponse:
    session = SessionLocal()
    user_id = 1
    sp = (
        session.query(ScheduledPayment)
        .filter(ScheduledPayment.id == payment_id, ScheduledPayment.user_id == user_id)
        .first()
    )
    if sp is None:
        fail(session, 404, f"Scheduled payment {payment_id} not found")
    if sp.status == "cancelled":
        fail(session, 409, f"Scheduled payment {payment_id} is cancelled")
    if body.status is not None and body.status.lower() not in ("active", "paused"):
        fail(session, 400, "status must be active or paused")
    if body.frequency is not None and body.frequency.lower() not in FREQUENCIES:
        fail(session, 400, f"frequency must be one of {', '.join(FREQUENCIES)}")
    if body.amount is not None and body.amount <= 0:
        fail(session, 400, "Amount must be greater than zero")
    if body.amount is not None:
        sp.amount = money(body.amount)
    if body.frequency is not None:
        sp.frequency = body.frequency.lower()
    if body.next_run_date is not None:
        sp.next_run_date = body.next_run_date
    if body.status is not None:
        sp.status = body.status.lower()
    if body.memo is not None:
        sp.memo = body.memo
    sp.updated_at = now_utc()
    session.commit()
    result = scheduled_to_model(session, sp)
    session.close()
    return ScheduledPaymentResponse(scheduled_payment=result)


@app.delete(
    "/api/scheduled-payments/{payment_id}",
    response_model=ScheduledPaymentResponse,
    summary="Cancel a scheduled payment",
    description="Cancel a scheduled payment for good; it stays in the list with status cancelled and will not run again.",
    tags=["scheduled_payments"],
    operation_id="cancel_scheduled_payment",
)
async def cancel_scheduled_payment(
    payment_id: int = Path(..., description="Scheduled payment ID."),
) -> ScheduledPaymentResponse:
    session = SessionLocal()
    user_id = 1
    sp = (
        session.query(ScheduledPayment)
        .filter(ScheduledPayment.id == payment_id, ScheduledPayment.user_id == user_id)
        .first()
    )
    if sp is None:
        fail(session, 404, f"Scheduled payment {payment_id} not found")
    if sp.status == "cancelled":
        fail(session, 409, f"Scheduled payment {payment_id} is already cancelled")
    sp.status = "cancelled"
    sp.updated_at = now_utc()
    session.commit()
    result = scheduled_to_model(session, sp)
    session.close()
    return ScheduledPaymentResponse(scheduled_payment=result)


if __name__ == "__main__":
    import uvicorn

    host = os.getenv("HOST", "127.0.0.1")
    port = int(os.getenv("PORT", "8000"))
    uvicorn.run(app, host=host, port=port)
