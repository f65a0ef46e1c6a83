from fastapi import FastAPI, HTTPException, Path, Query, Body
from pydantic import BaseModel, Field, ConfigDict
from typing import Optional, List, Literal
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
    UniqueConstraint,
    Index,
)
from sqlalchemy.orm import declarative_base, sessionmaker
from datetime import datetime, timezone
import os

database_url = os.getenv("DATABASE_PATH", "sqlite:///outputs/databases/online_grocery_1.db")

engine = create_engine(database_url, connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(bind=engine, autoflush=False, autocommit=False)

Base = declarative_base()

CURRENT_USER_ID = 1
CANCELLABLE_STATUSES = ("placed", "packed")


def now_utc() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def money(value: float) -> float:
    return round(float(value) + 1e-9, 2)


class User(Base):
    __tablename__ = "users"
    id = Column(Integer, primary_key=True)
    full_name = Column(String, nullable=False)
    email = Column(String, nullable=False, unique=True)
    phone = Column(String)
    created_at = Column(DateTime, default=now_utc)


class Category(Base):
    __tablename__ = "categories"
    id = Column(Integer, primary_key=True)
    name = Column(String, nullable=False, unique=True)
    description = Column(Text)


class Product(Base):
    __tablename__ = "products"
    __table_args__ = (
        CheckConstraint("price >= 0", name="ck_products_price"),
        CheckConstraint("stock_quantity >= 0", name="ck_products_stock"),
    )
    id = Column(Integer, primary_key=True)
    category_id = Column(Integer, ForeignKey("categories.id"), nullable=False)
    name = Column(String, nullable=False)
    brand = Column(String)
    unit = Column(String, nullable=False)
    price = Column(Float, nullable=False)
    stock_quantity = Column(Integer, nullable=False, default=0)
    is_organic = Column(Integer, nullable=False, default=0)
    is_active = Column(Integer, nullable=False, default=1)
    created_at = Column(DateTime, default=now_utc)


class Address(Base):
    __tablename__ = "addresses"
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, ForeignKey("users.id", ondelete="CASCADE"), nullable=False)
    label = Column(String, nullable=False)
    street = Column(String, nullable=False)
    city = Column(String, nullable=False)
    postal_code = Column(String, nullable=False)
    is_default = Column(Integer, nullable=False, default=0)
    created_at = Column(DateTime, default=now_utc)


class Coupon(Base):
    __tablename__ = "coupons"
    __table_args__ = (CheckConstraint("discount_percent BETWEEN 1 AND 100", name="ck_coupons_percent"),)
    id = Column(Integer, primary_key=True)
    code = Column(String, nullable=False, unique=True)
    description = Column(Text)
    discount_percent = Column(Integer, nullable=False)
    min_order_total = Column(Float, nullable=False, default=0)
    is_active = Column(Integer, nullable=False, default=1)
    expires_at = Column(DateTime)


class CartItem(Base):
    __tablename__ = "cart_items"
    __table_args__ = (
        UniqueConstraint("user_id", "product_id", name="uq_cart_user_product"),
        CheckConstraint("quantity > 0", name="ck_cart_quantity"),
    )
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, ForeignKey("users.id", ondelete="CASCADE"), nullable=False)
    product_id = Column(Integer, ForeignKey("products.id"), nullable=False)
    quantity = Column(Integer, nullable=False)
    added_at = Column(DateTime, default=now_utc)


class Order(Base):
    __tablename__ = "orders"
    __table_args__ = (
        CheckConstraint(
            "status IN ('placed','packed','out_for_delivery','delivered','cancelled')", name="ck_orders_status"
        ),
    )
    id = Column(Integer, primary_key=True)
    user_id = Column(Integer, ForeignKey("users.id"), nullable=False)
    address_id = Column(Integer, ForeignKey("addresses.id"), nullable=False)
    coupon_id = Column(Integer, ForeignKey("coupons.id"))
    status = Column(String, nullable=False, default="placed")
    delivery_slot = Column(String, nullable=False)
    subtotal = Column(Float, nullable=False)
    discount = Column(Float, nullable=False, default=0)
    total = Column(Float, nullable=False)
    cancel_reason = Column(Text)
    created_at = Column(DateTime, default=now_utc)
    updated_at = Column(DateTime, default=now_utc)


class OrderItem(Base):
    __tablename__ = "order_items"
    __table_args__ = (CheckConstraint("quantity > 0", name="ck_order_items_quantity"),)
    id = Column(Integer, primary_key=True)
    order_id = Column(Integer, ForeignKey("orders.id", ondelete="CASCADE"), nullable=False)
    product_id = Column(Integer, ForeignKey("products.id"), nullable=False)
    quantity = Column(Integer, nullable=False)
    unit_price = Column(Float, nullable=False)


Index("idx_products_category", Product.category_id)
Index("idx_products_name", Product.name)
Index("idx_addresses_user", Address.user_id)
Index("idx_cart_items_user", CartItem.user_id)
Index("idx_orders_user_created", Order.user_id, Order.created_at)
Index("idx_order_items_order", OrderItem.order_id)

Base.metadata.create_all(engine)

app = FastAPI(
    title="FreshCart Online Grocery API",
    version="1.0.0",
    description="Browse groceries, manage a cart and delivery addresses, apply coupons and place orders.",
)


# ---------------------------------------------------------------------------
# Pydantic models
# ---------------------------------------------------------------------------


class CategoryModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Category ID.", examples=[2])
    name: str = Field(..., description="Category name.", examples=["Dairy & Eggs"])
    description: Optional[str] = Field(None, description="Category description.")


class CategoryListResponse(BaseModel):
    categories: List[CategoryModel] = Field(default_factory=list, description="All categories.")


class ProductModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Product ID.", examples=[2])
    category_id: int = Field(..., description="Category ID.", examples=[1])
    name: str = Field(..., description="Product name.", examples=["Organic Baby Spinach"])
    brand: Optional[str] = Field(None, description="Brand.", examples=["Green Leaf Farms"])
    unit: str = Field(..., description="Pack size.", examples=["5 oz bag"])
    price: float = Field(..., description="Unit price in USD.", examples=[3.79])
    stock_quantity: int = Field(..., description="Units in stock.", examples=[40])
    is_organic: bool = Field(..., description="Certified organic.", examples=[True])
    is_active: bool = Field(..., description="Currently sold.", examples=[True])


class ProductListResponse(BaseModel):
    products: List[ProductModel] = Field(default_factory=list, description="Matching products.")


class CartLineModel(BaseModel):
    item_id: int = Field(..., description="Cart item ID (use it to change or remove the line).", examples=[1])
    product_id: int = Field(..., description="Product ID.", examples=[1])
    product_name: str = Field(..., description="Product name.", examples=["Honeycrisp Apples"])
    unit_price: float = Field(..., description="Current unit price.", examples=[2.99])
    quantity: int = Field(..., description="Quantity in the cart.", examples=[2])
    line_total: float = Field(..., description="unit_price x quantity.", examples=[5.98])


class CartResponse(BaseModel):
    items: List[CartLineModel] = Field(default_factory=list, description="Lines in the cart.")
    item_count: int = Field(..., description="Sum of quantities.", examples=[9])
    subtotal: float = Field(..., description="Sum of line totals.", examples=[54.91])


class AddressModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Address ID.", examples=[1])
    label: str = Field(..., description="Short name such as Home or Office.", examples=["Home"])
    street: str = Field(..., description="Street and number.", examples=["12 Elm Street"])
    city: str = Field(..., description="City.", examples=["Springfield"])
    postal_code: str = Field(..., description="Postal code.", examples=["62704"])
    is_default: bool = Field(..., description="Default delivery address.", examples=[True])


class AddressListResponse(BaseModel):
    addresses: List[AddressModel] = Field(default_factory=list, description="The user's saved addresses.")


class CouponModel(BaseModel):
    code: str = Field(..., description="Coupon code.", examples=["FRESH15"])
    description: Optional[str] = Field(None, description="What the coupon is for.")
    discount_percent: int = Field(..., description="Percent taken off the subtotal.", examples=[15])
    min_order_total: float = Field(..., description="Minimum subtotal required.", examples=[40.0])
    expires_at: Optional[datetime] = Field(None, description="Expiry time.")
    is_valid: bool = Field(..., description="Active and not expired right now.", examples=[True])


class OrderItemModel(BaseModel):
    product_id: int = Field(..., description="Product ID.", examples=[17])
    product_name: str = Field(..., description="Product name.", examples=["Barista Oat Milk"])
    quantity: int = Field(..., description="Quantity ordered.", examples=[2])
    unit_price: float = Field(..., description="Price paid per unit.", examples=[4.79])


class OrderModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Order ID.", examples=[3])
    address_id: int = Field(..., description="Delivery address ID.", examples=[1])
    coupon_id: Optional[int] = Field(None, description="Applied coupon ID.")
    status: str = Field(..., description="placed, packed, out_for_delivery, delivered or cancelled.", examples=["placed"])
    delivery_slot: str = Field(..., description="Requested delivery slot.", examples=["Sat 10:00-12:00"])
    subtotal: float = Field(..., description="Sum of item prices.", examples=[16.57])
    discount: float = Field(..., description="Coupon discount.", examples=[0.0])
    total: float = Field(..., description="Amount charged.", examples=[16.57])
    cancel_reason: Optional[str] = Field(None, description="Reason given when cancelled.")
    created_at: Optional[datetime] = Field(None, description="When the order was placed.")


class OrderListResponse(BaseModel):
    orders: List[OrderModel] = Field(default_factory=list, description="Orders, newest first.")


class OrderDetailResponse(BaseModel):
    order: OrderModel
    items: List[OrderItemModel] = Field(default_factory=list, description="Items of the order.")
    address_label: Optional[str] = Field(None, description="Label of the delivery address.")
    coupon_code: Optional[str] = Field(None, description="Code of the applied coupon.")


class StatusResponse(BaseModel):
    success: bool = Field(..., description="Whether the operation succeeded.", examples=[True])
    message: str = Field(..., description="Human readable result.", examples=["Item removed"])


class AddToCartBody(BaseModel):
    product_id: int = Field(..., description="Product to add.", examples=[2])
    quantity: int = Field(1, ge=1, le=99, description="Units to add; added to any quantity already in the cart.")


class CartQuantityBody(BaseModel):
    quantity: int = Field(..., ge=1, le=99, description="New quantity for the cart line.", examples=[6])


class AddressCreateBody(BaseModel):
    label: str = Field(..., min_length=1, description="Short name, e.g. Home.", examples=["Parents"])
    street: str = Field(..., min_length=1, description="Street and number.", examples=["48 Maple Avenue"])
    city: str = Field(..., min_length=1, description="City.", examples=["Springfield"])
    postal_code: str = Field(..., min_length=3, description="Postal code.", examples=["62702"])
    is_default: bool = Field(False, description="Make this the default delivery address.")


class AddressUpdateBody(BaseModel):
    label: str = Field(..., min_length=1, description="Short name, e.g. Home.", examples=["Home"])
    street: str = Field(..., min_length=1, description="Street and number.", examples=["12 Elm Street"])
    city: str = Field(..., min_length=1, description="City.", examples=["Springfield"])
    postal_code: str = Field(..., min_length=3, description="Postal code.", examples=["62704"])
    is_default: bool = Field(..., description="Whether this is the default delivery address.")


class PlaceOrderBody(BaseModel):
    address_id: int = Field(..., description="One of the user's saved addresses.", examples=[2])
    delivery_slot: str = Field(..., min_length=1, description="Delivery slot text.", examples=["Sat 10:00-12:00"])
    coupon_code: Optional[str] = Field(None, description="Optional coupon code to apply.", examples=["FRESH15"])


class CancelOrderBody(BaseModel):
    reason: str = Field(..., min_length=1, description="Why the order is cancelled.", examples=["Ordered by mistake"])


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _product_model(p: Product) -> ProductModel:
    return ProductModel(
        id=p.id,
        category_id=p.category_id,
        name=p.name,
        brand=p.brand,
        unit=p.unit,
        price=p.price,
        stock_quantity=p.stock_quantity,
        is_organic=bool(p.is_organic),
        is_active=bool(p.is_active),
    )


def _address_model(a: Address) -> AddressModel:
    return AddressModel(
        id=a.id, label=a.label, street=a.street, city=a.city, postal_code=a.postal_code, is_default=bool(a.is_default)
    )


def _cart(session) -> CartResponse:
    rows = (
        session.query(CartItem, Product)
        .join(Product, Product.id == CartItem.product_id)
        .filter(CartItem.user_id == CURRENT_USER_ID)
        .order_by(CartItem.id.asc())
        .all()
    )
    lines = [
        CartLineModel(
            item_id=c.id,
            product_id=p.id,
            product_name=p.name,
            unit_price=p.price,
            quantity=c.quantity,
            line_total=money(p.price * c.quantity),
        )
        for c, p in rows
    ]
    return CartResponse(
        items=lines,
        item_count=sum(line.quantity for line in lines),
        subtotal=money(sum(line.line_total for line in lines)),
    )


def _coupon_is_valid(coupon: Coupon) -> bool:
    if not coupon.is_active:
        return False
    return coupon.expires_at is None or coupon.expires_at > now_utc()


def _order_detail(session, order: Order) -> OrderDetailResponse:
    rows = (
        session.query(OrderItem, Product)
        .join(Product, Product.id == OrderItem.product_id)
        .filter(OrderItem.order_id == order.id)
        .order_by(OrderItem.id.asc())
        .all()
    )
    items = [
        OrderItemModel(product_id=p.id, product_name=p.name, quantity=oi.quantity, unit_price=oi.unit_price)
        for oi, p in rows
    ]
    address = session.query(Address).filter(Address.id == order.address_id).first()
    coupon = session.query(Coupon).filter(Coupon.id == order.coupon_id).first() if order.coupon_id else None
    return OrderDetailResponse(
        order=OrderModel.model_validate(order),
        items=items,
        address_label=address.label if address else None,
        coupon_code=coupon.code if coupon else None,
    )


# ---------------------------------------------------------------------------
# Catalogue
# ---------------------------------------------------------------------------


@app.get(
    "/api/categories",
    response_model=CategoryListResponse,
    summary="List categories",
    description="List all grocery categories.",
    tags=["catalog"],
    operation_id="list_categories",
)
async def list_categories() -> CategoryListResponse:
    session = SessionLocal()
    categories = [CategoryModel.model_validate(c) for c in session.query(Category).order_by(Category.name.asc()).all()]
    session.close()
    return CategoryListResponse(categories=categories)


@app.get(
    "/api/products",
    response_model=ProductListResponse,
    summary="Search products",
    description="Search products that are currently sold by name or brand, optionally within a category, organic only or under a maximum price. Results are sorted by price, cheapest first.",
    tags=["catalog"],
    operation_id="search_products",
)
async def search_products(
    query: Optional[str] = Query(None, description="Case-insensitive text to match in name or brand.", examples=["spinach"]),
    category_id: Optional[int] = Query(None, description="Only products of this category."),
    organic_only: bool = Query(False, description="Only certified organic products."),
    max_price: Optional[float] = Query(None, ge=0, description="Only products at or below this price."),
    limit: int = Query(50, ge=1, le=200, description="Maximum number of products to return."),
) -> ProductListResponse:
    session = SessionLocal()
    q = session.query(Product).filter(Product.is_active == 1)
    if query:
        pattern = f"%{query}%"
        q = q.filter(Product.name.ilike(pattern) | Product.brand.ilike(pattern))
    if category_id is not None:
        q = q.filter(Product.category_id == category_id)
    if organic_only:
        q = q.filter(Product.is_organic == 1)
    if max_price is not None:
        q = q.filter(Product.price <= max_price)
    products = [_product_model(p) for p in q.order_by(Product.price.asc(), Product.id.asc()).limit(limit).all()]
    session.close()
    return ProductListResponse(products=products)


@app.get(
    "/api/products/{product_id}",
    response_model=ProductModel,
    summary="Get a product",
    description="Return one product with its price, pack size and stock.",
    tags=["catalog"],
    operation_id="get_product",
)
async def get_product(
    product_id: int = Path(..., description="Product ID.", examples=[2]),
) -> ProductModel:
    session = SessionLocal()
    product = session.query(Product).filter(Product.id == product_id).first()
    if product is None:
        session.close()
        raise HTTPException(status_code=404, detail="Product not found")
    result = _product_model(product)
    session.close()
    return result


# ---------------------------------------------------------------------------
# Cart
# ---------------------------------------------------------------------------


@app.get(
    "/api/cart",
    response_model=CartResponse,
    summary="View my cart",
    description="Return the current user's cart lines with current prices and the subtotal.",
    tags=["cart"],
    operation_id="get_cart",
)
async def get_cart() -> CartResponse:
    session = SessionLocal()
    result = _cart(session)
    session.close()
    return result


@app.post(
    "/api/cart/items",
    response_model=CartResponse,
    summary="Add a product to my cart",
    description="Add units of a product to the cart. If the product is already in the cart, the quantity is increased by the given amount.",
    tags=["cart"],
    operation_id="add_to_cart",
)
async def add_to_cart(
    payload: AddToCartBody = Body(..., description="Product and quantity to add."),
) -> CartResponse:
    session = SessionLocal()
    product = session.query(Product).filter(Product.id == payload.product_id).first()
    if product is None:
        session.close()
        raise HTTPException(status_code=404, detail="Product not found")
    if not product.is_active:
        session.close()
        raise HTTPException(status_code=400, detail="Product is not available")
    line = (
        session.query(CartItem)
        .filter(CartItem.user_id == CURRENT_USER_ID, CartItem.product_id == product.id)
        .first()
    )
    new_quantity = payload.quantity + (line.quantity if line else 0)
    if new_quantity > product.stock_quantity:
        session.close()
        raise HTTPException(status_code=400, detail=f"Only {product.stock_quantity} units in stock")
    if line is None:
        session.add(CartItem(user_id=CURRENT_USER_ID, product_id=product.id, quantity=new_quantity, added_at=now_utc()))
    else:
        line.quantity = new_quantity
    session.commit()
    result = _cart(session)
    session.close()
    return result


@app.patch(
    "/api/cart/items/{item_id}",
    response_model=CartResponse,
    summary="Change a cart line quantity",
    description="Set the quantity of one line of the cart (replaces the previous quantity).",
    tags=["cart"],
    operation_id="update_cart_item",
)
async def update_cart_item(
    item_id: int = Path(..., description="Cart item ID from get_cart.", examples=[1]),
    payload: CartQuantityBody = Body(..., description="New quantity."),
) -> CartResponse:
    session = SessionLocal()
    line = session.query(CartItem).filter(CartItem.id == item_id, CartItem.user_id == CURRENT_USER_ID).first()
    if line is None:
        session.close()
        raise HTTPException(status_code=404, detail="Cart item not found")
    product = session.query(Product).filter(Product.id == line.product_id).first()
    if product is not None and payload.quantity > product.stock_quantity:
        session.close()
        raise HTTPException(status_code=400, detail=f"Only {product.stock_quantity} units in stock")
    line.quantity = payload.quantity
    session.commit()
    result = _cart(session)
    session.close()
    return result


@app.delete(
    "/api/cart/items/{item_id}",
    response_model=CartResponse,
    summary="Remove a cart line",
    description="Remove one line from the cart.",
    tags=["cart"],
    operation_id="remove_cart_item",
)
async def remove_cart_item(
    item_id: int = Path(..., description="Cart item ID from get_cart.", examples=[2]),
) -> CartResponse:
    session = SessionLocal()
    line = session.query(CartItem).filter(CartItem.id == item_id, CartItem.user_id == CURRENT_USER_ID).first()
    if line is None:
        session.close()
        raise HTTPException(status_code=404, detail="Cart item not found")
    session.delete(line)
    session.commit()
    result = _cart(session)
    session.close()
    return result


@app.delete(
    "/api/cart",
    response_model=StatusResponse,
    summary="Empty my cart",
    description="Remove every line from the current user's cart.",
    tags=["cart"],
    operation_id="clear_cart",
)
async def clear_cart() -> StatusResponse:
    session = SessionLocal()
    removed = session.query(CartItem).filter(CartItem.user_id == CURRENT_USER_ID).delete(synchronize_session=False)
    session.commit()
    session.close()
    return StatusResponse(success=True, message=f"Removed {removed} cart lines")


# ---------------------------------------------------------------------------
# Addresses
# ---------------------------------------------------------------------------


@app.get(
    "/api/addresses",
    response_model=AddressListResponse,
    summary="List my addresses",
    description="List the current user's saved delivery addresses.",
    tags=["addresses"],
    operation_id="list_addresses",
)
async def list_addresses() -> AddressListResponse:
    session = SessionLocal()
    addresses = [
        _address_model(a)
        for a in session.query(Address).filter(Address.user_id == CURRENT_USER_ID).order_by(Address.id.asc()).all()
    ]
    session.close()
    return AddressListResponse(addresses=addresses)


@app.post(
    "/api/addresses",
    response_model=AddressModel,
    summary="Add an address",
    description="Save a new delivery address. With is_default true it becomes the only default address.",
    tags=["addresses"],
    operation_id="add_address",
)
async def add_address(
    payload: AddressCreateBody = Body(..., description="New address."),
) -> AddressModel:
    session = SessionLocal()
    if payload.is_default:
        session.query(Address).filter(Address.user_id == CURRENT_USER_ID).update(
            {Address.is_default: 0}, synchronize_session=False
        )
    address = Address(
        user_id=CURRENT_USER_ID,
        label=payload.label.strip(),
        street=payload.street.strip(),
        city=payload.city.strip(),
        postal_code=payload.postal_code.strip(),
        is_default=1 if payload.is_default else 0,
        created_at=now_utc(),
    )
    session.add(address)
    session.commit()
    session.refresh(address)
    result = _address_model(address)
    session.close()
    return result


@app.put(
    "/api/addresses/{address_id}",
    response_model=AddressModel,
    summary="Replace an address",
    description="Replace all fields of one of the user's saved addresses. With is_default true it becomes the only default address.",
    tags=["addresses"],
    operation_id="update_address",
)
async def update_address(
    address_id: int = Path(..., description="Address ID.", examples=[1]),
    payload: AddressUpdateBody = Body(..., description="Complete new address."),
) -> AddressModel:
    session = SessionLocal()
    address = (
        session.query(Address).filter(Address.id == address_id, Address.user_id == CURRENT_USER_ID).first()
    )
    if address is None:
        session.close()
        raise HTTPException(status_code=404, detail="Address not found")
    if payload.is_default:
        session.query(Address).filter(Address.user_id == CURRENT_USER_ID, Address.id != address_id).update(
            {Address.is_default: 0}, synchronize_session=False
        )
    address.label = payload.label.strip()
    address.street = payload.street.strip()
    address.city = payload.city.strip()
    address.postal_code = payload.postal_code.strip()
    address.is_default = 1 if payload.is_default else 0
    session.commit()
    session.refresh(address)
    result = _address_model(address)
    session.close()
    return result


# ---------------------------------------------------------------------------
# Coupons and orders
# ---------------------------------------------------------------------------


@app.get(
    "/api/coupons/{code}",
    response_model=CouponModel,
    summary="Look up a coupon",
    description="Return the discount, minimum order total and validity of a coupon code.",
    tags=["coupons"],
    operation_id="get_coupon",
)
async def get_coupon(
    code: str = Path(..., description="Coupon code (case-insensitive).", examples=["FRESH15"]),
) -> CouponModel:
    session = SessionLocal()
    coupon = session.query(Coupon).filter(Coupon.code == code.strip().upper()).first()
    if coupon is None:
        session.close()
        raise HTTPException(status_code=404, detail="Coupon not found")
    result = CouponModel(
        code=coupon.code,
        description=coupon.description,
        discount_percent=coupon.discount_percent,
        min_order_total=coupon.min_order_total,
        expires_at=coupon.expires_at,
        is_valid=_coupon_is_valid(coupon),
    )
    session.close()
    return result


@app.post(
    "/api/orders",
    response_model=OrderDetailResponse,
    summary="Check out my cart",
    description="Place an order for everything in the cart, delivered to one of the user's addresses in the given slot, optionally with a coupon. Stock is reserved and the cart is emptied.",
    tags=["orders"],
    operation_id="place_order",
)
async def place_order(
    payload: PlaceOrderBody = Body(..., description="Checkout details."),
) -> OrderDetailResponse:
    session = SessionLocal()
    address = (
        session.query(Address)
        .filter(Address.id == payload.address_id, Address.user_id == CURRENT_USER_ID)
        .first()
    )
    if address is None:
        session.close()
        raise HTTPException(status_code=404, detail="Address not found")
    rows = (
        session.query(CartItem, Product)
        .join(Product, Product.id == CartItem.product_id)
        .filter(CartItem.user_id == CURRENT_USER_ID)
        .order_by(CartItem.id.asc())
        .all()
    )
    if not rows:
        session.close()
        raise HTTPException(status_code=400, detail="Cart is empty")
    for line, product in rows:
        if not product.is_active or line.quantity > product.stock_quantity:
            session.close()
            raise HTTPException(status_code=400, detail=f"Not enough stock for {product.name}")
    subtotal = money(sum(p.price * c.quantity for c, p in rows))
    coupon = None
    discount = 0.0
    if payload.coupon_code:
        coupon = session.query(Coupon).filter(Coupon.code == payload.coupon_code.strip().upper()).first()
        if coupon is None:
            session.close()
            raise HTTPException(status_code=404, detail="Coupon not found")
        if not _coupon_is_valid(coupon):
            session.close()
            raise HTTPException(status_code=400, detail="Coupon is expired or inactive")
        if subtotal < coupon.min_order_total:
            session.close()
            raise HTTPException(status_code=400, detail=f"Coupon requires a subtotal of at least {coupon.min_order_total:.2f}")
        discount = money(subtotal * coupon.discount_percent / 100.0)
    now = now_utc()
    order = Order(
        user_id=CURRENT_USER_ID,
        address_id=address.id,
        coupon_id=coupon.id if coupon else None,
        status="placed",
        delivery_slot=payload.delivery_slot.strip(),
        subtotal=subtotal,
        discount=discount,
        total=money(subtotal - discount),
        created_at=now,
        updated_at=now,
    )
    session.add(order)
    session.flush()
    for line, product in rows:
        session.add(OrderItem(order_id=order.id, product_id=product.id, quantity=line.quantity, unit_price=product.price))
        product.stock_quantity = product.stock_quantity - line.quantity
        session.delete(line)
    session.commit()
    session.refresh(order)
    result = _order_detail(session, order)
    session.close()
    return result


@app.get(
    "/api/orders",
    response_model=OrderListResponse,
    summary="List my orders",
    description="List the current user's orders, newest first, optionally filtered by status.",
    tags=["orders"],
    operation_id="list_orders",
)
async def list_orders(
    status: Optional[Literal["placed", "packed", "out_for_delivery", "delivered", "cancelled"]] = Query(
        None, description="Only orders with this status."
    ),
) -> OrderListResponse:
    session = SessionLocal()
    q = session.query(Order).filter(Order.user_id == CURRENT_USER_ID)
    if status is not None:
        q = q.filter(Order.status == status)
    orders = [OrderModel.model_validate(o) for o in q.order_by(Order.created_at.desc(), Order.id.desc()).all()]
    session.close()
    return OrderListResponse(orders=orders)


@app.get(
    "/api/orders/{order_id}",
    response_model=OrderDetailResponse,
    summary="Get order details",
    description="Return one of the current user's orders with its items, delivery address label and coupon.",
    tags=["orders"],
    operation_id="get_order_details",
)
async def get_order_details(
    order_id: int = Path(..., description="Order ID.", examples=[2]),
) -> OrderDetailResponse:
    session = SessionLocal()
    order = session.query(Order).filter(Order.id == order_id, Order.user_id == CURRENT_USER_ID).first()
    if order is None:
        session.close()
        raise HTTPException(status_code=404, detail="Order not found")
    result = _order_detail(session, order)
    session.close()
    return result


@app.post(
    "/api/orders/{order_id}/cancel",
    response_model=OrderDetailResponse,
    summary="Cancel an order",
    description="Cancel an order that has not left the store yet (status placed or packed). Its items go back into stock.",
    tags=["orders"],
    operation_id="cancel_order",
)
async def cancel_order(
    order_id: int = Path(..., description="Order ID.", examples=[3]),
    payload: CancelOrderBody = Body(..., description="Cancellation reason."),
) -> OrderDetailResponse:
    session = SessionLocal()
    order = session.query(Order).filter(Order.id == order_id, Order.user_id == CURRENT_USER_ID).first()
    if order is None:
        session.close()
        raise HTTPException(status_code=404, detail="Order not found")
    if order.status not in CANCELLABLE_STATUSES:
        session.close()
        raise HTTPException(status_code=400, detail=f"An order with status {order.status} cannot be cancelled")
    for item in session.query(OrderItem).filter(OrderItem.order_id == order.id).all():
        product = session.query(Product).filter(Product.id == item.product_id).first()
        if product is not None:
            product.stock_quantity = product.stock_quantity + item.quantity
    order.status = "cancelled"
    order.cancel_reason = payload.reason.strip()
    order.updated_at = now_utc()
    session.commit()
    session.refresh(order)
    result = _order_detail(session, order)
    session.close()
    return result


if __name__ == "__main__":
    import uvicorn

    host = os.getenv("HOST", "127.0.0.1")
    port = int(os.getenv("PORT", "8000"))
    uvicorn.run(app, host=host, port=port)
