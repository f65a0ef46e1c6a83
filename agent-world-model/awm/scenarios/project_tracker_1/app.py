from fastapi import FastAPI, HTTPException, Path, Query, Body
from pydantic import BaseModel, Field, ConfigDict
from typing import Optional, List, Literal
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
from datetime import datetime, date, timezone
import os

database_url = os.getenv("DATABASE_PATH", "sqlite:///outputs/databases/project_tracker_1.db")

engine = create_engine(database_url, connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(bind=engine, autoflush=False, autocommit=False)

Base = declarative_base()

CURRENT_USER_ID = 1


def now_utc() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class User(Base):
    __tablename__ = "users"
    __table_args__ = (CheckConstraint("role IN ('admin','member','viewer')", name="ck_users_role"),)
    id = Column(Integer, primary_key=True)
    username = Column(String, nullable=False, unique=True)
    full_name = Column(String, nullable=False)
    email = Column(String, nullable=False, unique=True)
    role = Column(String, nullable=False, default="member")
    created_at = Column(DateTime, default=now_utc)


class Project(Base):
    __tablename__ = "projects"
    __table_args__ = (CheckConstraint("status IN ('active','archived')", name="ck_projects_status"),)
    id = Column(Integer, primary_key=True)
    key = Column(String, nullable=False, unique=True)
    name = Column(String, nullable=False, unique=True)
    description = Column(Text)
    owner_id = Column(Integer, ForeignKey("users.id"), nullable=False)
    status = Column(String, nullable=False, default="active")
    created_at = Column(DateTime, default=now_utc)


class ProjectMember(Base):
    __tablename__ = "project_members"
    __table_args__ = (CheckConstraint("role IN ('maintainer','developer','reporter')", name="ck_members_role"),)
    project_id = Column(Integer, ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    user_id = Column(Integer, ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    role = Column(String, nullable=False, default="developer")
    joined_at = Column(DateTime, default=now_utc)


class Issue(Base):
    __tablename__ = "issues"
    __table_args__ = (
        CheckConstraint("status IN ('open','in_progress','resolved','closed')", name="ck_issues_status"),
        CheckConstraint("priority IN ('low','medium','high','critical')", name="ck_issues_priority"),
    )
    id = Column(Integer, primary_key=True)
    project_id = Column(Integer, ForeignKey("projects.id", ondelete="CASCADE"), nullable=False)
    title = Column(String, nullable=False)
    description = Column(Text)
    status = Column(String, nullable=False, default="open")
    priority = Column(String, nullable=False, default="medium")
    reporter_id = Column(Integer, ForeignKey("users.id"), nullable=False)
    assignee_id = Column(Integer, ForeignKey("users.id"))
    due_date = Column(Date)
    created_at = Column(DateTime, default=now_utc)
    updated_at = Column(DateTime, default=now_utc)


class Label(Base):
    __tablename__ = "labels"
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_labels_project_name"),)
    id = Column(Integer, primary_key=True)
    project_id = Column(Integer, ForeignKey("projects.id", ondelete="CASCADE"), nullable=False)
    name = Column(String, nullable=False)
    color = Column(String, nullable=False, default="#cccccc")
    created_at = Column(DateTime, default=now_utc)


class IssueLabel(Base):
    __tablename__ = "issue_labels"
    issue_id = Column(Integer, ForeignKey("issues.id", ondelete="CASCADE"), primary_key=True)
    label_id = Column(Integer, ForeignKey("labels.id", ondelete="CASCADE"), primary_key=True)
    added_at = Column(DateTime, default=now_utc)


class Comment(Base):
    __tablename__ = "comments"
    id = Column(Integer, primary_key=True)
    issue_id = Column(Integer, ForeignKey("issues.id", ondelete="CASCADE"), nullable=False)
    author_id = Column(Integer, ForeignKey("users.id"), nullable=False)
    body = Column(Text, nullable=False)
    created_at = Column(DateTime, default=now_utc)


Index("idx_users_full_name", User.full_name)
Index("idx_projects_status", Project.status)
Index("idx_project_members_user", ProjectMember.user_id)
Index("idx_issues_project_status", Issue.project_id, Issue.status)
Index("idx_issues_assignee", Issue.assignee_id)
Index("idx_issues_title", Issue.title)
Index("idx_issue_labels_label", IssueLabel.label_id)
Index("idx_comments_issue", Comment.issue_id, Comment.created_at)

Base.metadata.create_all(engine)

app = FastAPI(
    title="Trackly Issue Tracker API",
    version="1.0.0",
    description="Projects, issues, labels, assignments and comments for a small software team.",
)


# ---------------------------------------------------------------------------
# Pydantic models
# ---------------------------------------------------------------------------


class UserModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="User ID.", examples=[3])
    username: str = Field(..., description="Unique login handle.", examples=["marcus.lee"])
    full_name: str = Field(..., description="Display name.", examples=["Marcus Lee"])
    email: str = Field(..., description="Email address.", examples=["marcus.lee@trackly.io"])
    role: str = Field(..., description="Workspace role: admin, member or viewer.", examples=["member"])


class UserListResponse(BaseModel):
    users: List[UserModel] = Field(default_factory=list, description="Matching users.")


class ProjectModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Project ID.", examples=[2])
    key: str = Field(..., description="Short project key used in issue references.", examples=["MOB"])
    name: str = Field(..., description="Project name.", examples=["Mobile App"])
    description: Optional[str] = Field(None, description="Project description.")
    owner_id: int = Field(..., description="User ID of the project owner.", examples=[1])
    status: str = Field(..., description="active or archived.", examples=["active"])
    created_at: Optional[datetime] = Field(None, description="Creation time.")


class ProjectListResponse(BaseModel):
    projects: List[ProjectModel] = Field(default_factory=list, description="Projects.")


class MemberModel(BaseModel):
    user_id: int = Field(..., description="Member user ID.", examples=[3])
    full_name: str = Field(..., description="Member display name.", examples=["Marcus Lee"])
    role: str = Field(..., description="maintainer, developer or reporter.", examples=["developer"])


class ProjectDetailResponse(BaseModel):
    project: ProjectModel
    members: List[MemberModel] = Field(default_factory=list, description="Project members.")
    open_issue_count: int = Field(..., description="Issues with status open or in_progress.", examples=[4])


class LabelModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Label ID.", examples=[6])
    project_id: int = Field(..., description="Project the label belongs to.", examples=[2])
    name: str = Field(..., description="Label name.", examples=["regression"])
    color: str = Field(..., description="Hex colour, e.g. #fbca04.", examples=["#fbca04"])


class LabelListResponse(BaseModel):
    labels: List[LabelModel] = Field(default_factory=list, description="Labels of the project.")


class IssueModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Issue ID.", examples=[7])
    project_id: int = Field(..., description="Project ID.", examples=[2])
    title: str = Field(..., description="Issue title.", examples=["Push notifications arrive twice"])
    description: Optional[str] = Field(None, description="Issue description.")
    status: str = Field(..., description="open, in_progress, resolved or closed.", examples=["open"])
    priority: str = Field(..., description="low, medium, high or critical.", examples=["high"])
    reporter_id: int = Field(..., description="User who reported the issue.", examples=[3])
    assignee_id: Optional[int] = Field(None, description="Assigned user, if any.", examples=[3])
    due_date: Optional[date] = Field(None, description="Due date (YYYY-MM-DD).", examples=["2025-07-01"])
    created_at: Optional[datetime] = Field(None, description="Creation time.")
    updated_at: Optional[datetime] = Field(None, description="Last update time.")


class IssueListResponse(BaseModel):
    issues: List[IssueModel] = Field(default_factory=list, description="Matching issues.")
    total: int = Field(..., description="Number of issues returned.", examples=[3])


class IssueDetailResponse(BaseModel):
    issue: IssueModel
    project_name: str = Field(..., description="Name of the issue's project.", examples=["Mobile App"])
    reporter_name: Optional[str] = Field(None, description="Full name of the reporter.")
    assignee_name: Optional[str] = Field(None, description="Full name of the assignee.")
    labels: List[LabelModel] = Field(default_factory=list, description="Labels on the issue.")
    comment_count: int = Field(..., description="Number of comments.", examples=[2])


class CommentModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int = Field(..., description="Comment ID.", examples=[8])
    issue_id: int = Field(..., description="Issue ID.", examples=[12])
    author_id: int = Field(..., description="Author user ID.", examples=[1])
    body: str = Field(..., description="Comment text.", examples=["Fixed in v2.3"])
    created_at: Optional[datetime] = Field(None, description="Creation time.")


class CommentListResponse(BaseModel):
    comments: List[CommentModel] = Field(default_factory=list, description="Comments, oldest first.")


class IssueLabelResponse(BaseModel):
    issue_id: int = Field(..., description="Issue ID.", examples=[7])
    labels: List[LabelModel] = Field(default_factory=list, description="Labels now on the issue.")


class StatusResponse(BaseModel):
    success: bool = Field(..., description="Whether the operation succeeded.", examples=[True])
    message: str = Field(..., description="Human readable result.", examples=["Issue deleted"])


class IssueCreateBody(BaseModel):
    project_id: int = Field(..., description="Project to file the issue in.", examples=[2])
    title: str = Field(..., min_length=1, description="Issue title.", examples=["Add dark mode toggle"])
    description: Optional[str] = Field(None, description="Longer description.")
    priority: Literal["low", "medium", "high", "critical"] = Field("medium", description="Priority.")
    assignee_id: Optional[int] = Field(None, description="User to assign; must be a project member.")
    due_date: Optional[date] = Field(None, description="Due date (YYYY-MM-DD).")


class IssueUpdateBody(BaseModel):
    title: Optional[str] = Field(None, min_length=1, description="New title.")
    description: Optional[str] = Field(None, description="New description.")
    status: Optional[Literal["open", "in_progress", "resolved", "closed"]] = Field(None, description="New status.")
    priority: Optional[Literal["low", "medium", "high", "critical"]] = Field(None, description="New priority.")
    due_date: Optional[date] = Field(None, description="New due date (YYYY-MM-DD).")


class AssignBody(BaseModel):
    assignee_id: Optional[int] = Field(None, description="User to assign; null to unassign.", examples=[5])


class LabelCreateBody(BaseModel):
    name: str = Field(..., min_length=1, description="Label name, unique within the project.", examples=["needs-design"])
    color: str = Field("#cccccc", pattern=r"^#[0-9a-fA-F]{6}$", description="Hex colour.", examples=["#a855f7"])


class IssueLabelBody(BaseModel):
    label_id: int = Field(..., description="Label to attach; must belong to the issue's project.", examples=[6])


class CommentCreateBody(BaseModel):
    body: str = Field(..., min_length=1, description="Comment text.", examples=["Fixed by streaming parser"])


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _labels_of_issue(session, issue_id: int) -> List[LabelModel]:
    rows = (
        session.query(Label)
        .join(IssueLabel, IssueLabel.label_id == Label.id)
        .filter(IssueLabel.issue_id == issue_id)
        .order_by(Label.name.asc())
        .all()
    )
    return [LabelModel.model_validate(r) for r in rows]


def _is_member(session, project_id: int, user_id: int) -> bool:
    return (
        session.query(ProjectMember)
        .filter(ProjectMember.project_id == project_id, ProjectMember.user_id == user_id)
        .first()
        is not None
    )


# ---------------------------------------------------------------------------
# Projects and users
# ---------------------------------------------------------------------------


@app.get(
    "/api/projects",
    response_model=ProjectListResponse,
    summary="List projects",
    description="List all projects in the workspace, optionally filtered by status (active or archived).",
    tags=["projects"],
    operation_id="list_projects",
)
async def list_projects(
    status: Optional[Literal["active", "archived"]] = Query(None, description="Filter by project status."),
) -> ProjectListResponse:
    session = SessionLocal()
    q = session.query(Project)
    if status is not None:
        q = q.filter(Project.status == status)
    projects = [ProjectModel.model_validate(p) for p in q.order_by(Project.name.asc()).all()]
    session.close()
    return ProjectListResponse(projects=projects)


@app.get(
    "/api/projects/{project_id}",
    response_model=ProjectDetailResponse,
    summary="Get project details",
    description="Return one project with its members and the number of open or in-progress issues.",
    tags=["projects"],
    operation_id="get_project",
)
async def get_project(
    project_id: int = Path(..., description="Project ID.", examples=[2]),
) -> ProjectDetailResponse:
    session = SessionLocal()
    project = session.query(Project).filter(Project.id == project_id).first()
    if project is None:
        session.close()
        raise HTTPException(status_code=404, detail="Project not found")
    rows = (
        session.query(ProjectMember, User)
        .join(User, User.id == ProjectMember.user_id)
        .filter(ProjectMember.project_id == project_id)
        .order_by(User.full_name.asc())
        .all()
    )
    members = [MemberModel(user_id=u.id, full_name=u.full_name, role=m.role) for m, u in rows]
    open_count = (
        session.query(func.count(Issue.id))
        .filter(Issue.project_id == project_id, Issue.status.in_(["open", "in_progress"]))
        .scalar()
    )
    result = ProjectDetailResponse(
        project=ProjectModel.model_validate(project), members=members, open_issue_count=open_count or 0
    )
    session.close()
    return result


@app.get(
    "/api/users",
    response_model=UserListResponse,
    summary="Search users",
    description="Search workspace users by part of their name, username or email. Without a query, all users are listed.",
    tags=["users"],
    operation_id="search_users",
)
async def search_users(
    query: Optional[str] = Query(None, description="Case-insensitive text to match.", examples=["sofia"]),
) -> UserListResponse:
    session = SessionLocal()
    q = session.query(User)
    if query:
        pattern = f"%{query}%"
        q = q.filter(User.full_name.ilike(pattern) | User.username.ilike(pattern) | User.email.ilike(pattern))
    users = [UserModel.model_validate(u) for u in q.order_by(User.id.asc()).all()]
    session.close()
    return UserListResponse(users=users)


# ---------------------------------------------------------------------------
# Issues
# ---------------------------------------------------------------------------


@app.get(
    "/api/issues",
    response_model=IssueListResponse,
    summary="Search issues",
    description="Search issues across projects. Filters combine with AND: project, status, assignee, label name and title text.",
    tags=["issues"],
    operation_id="search_issues",
)
async def search_issues(
    project_id: Optional[int] = Query(None, description="Only issues of this project."),
    status: Optional[Literal["open", "in_progress", "resolved", "closed"]] = Query(None, description="Only issues with this status."),
    assignee_id: Optional[int] = Query(None, description="Only issues assigned to this user."),
    label: Optional[str] = Query(None, description="Only issues carrying a label with this exact name."),
    query: Optional[str] = Query(None, description="Case-insensitive text to match in the title."),
    limit: int = Query(50, ge=1, le=200, description="Maximum number of issues to return."),
) -> IssueListResponse:
    session = SessionLocal()
    q = session.query(Issue)
    if project_id is not None:
        q = q.filter(Issue.project_id == project_id)
    if status is not None:
        q = q.filter(Issue.status == status)
    if assignee_id is not None:
        q = q.filter(Issue.assignee_id == assignee_id)
    if label:
        q = (
            q.join(IssueLabel, IssueLabel.issue_id == Issue.id)
            .join(Label, Label.id == IssueLabel.label_id)
            .filter(Label.name == label)
        )
    if query:
        q = q.filter(Issue.title.ilike(f"%{query}%"))
    issues = [IssueModel.model_validate(i) for i in q.order_by(Issue.id.asc()).limit(limit).all()]
    session.close()
    return IssueListResponse(issues=issues, total=len(issues))


@app.get(
    "/api/issues/{issue_id}",
    response_model=IssueDetailResponse,
    summary="Get issue details",
    description="Return one issue with its project name, reporter and assignee names, labels and comment count.",
    tags=["issues"],
    operation_id="get_issue",
)
async def get_issue(
    issue_id: int = Path(..., description="Issue ID.", examples=[7]),
) -> IssueDetailResponse:
    session = SessionLocal()
    issue = session.query(Issue).filter(Issue.id == issue_id).first()
    if issue is None:
        session.close()
        raise HTTPException(status_code=404, detail="Issue not found")
    project = session.query(Project).filter(Project.id == issue.project_id).first()
    reporter = session.query(User).filter(User.id == issue.reporter_id).first()
    assignee = session.query(User).filter(User.id == issue.assignee_id).first() if issue.assignee_id else None
    comment_count = session.query(func.count(Comment.id)).filter(Comment.issue_id == issue_id).scalar()
    result = IssueDetailResponse(
        issue=IssueModel.model_validate(issue),
        project_name=project.name if project else "",
        reporter_name=reporter.full_name if reporter else None,
        assignee_name=assignee.full_name if assignee else None,
        labels=_labels_of_issue(session, issue_id),
        comment_count=comment_count or 0,
    )
    session.close()
    return result


@app.post(
    "/api/issues",
    response_model=IssueModel,
    summary="Create an issue",
    description="File a new issue in a project as the current user. The issue starts with status open. The assignee, if given, must be a member of the project.",
    tags=["issues"],
    operation_id="create_issue",
)
async def create_issue(
    payload: IssueCreateBody = Body(..., description="New issue fields."),
) -> IssueModel:
    session = SessionLocal()
    project = session.query(Project).filter(Project.id == payload.project_id).first()
    if project is None:
        session.close()
        raise HTTPException(status_code=404, detail="Project not found")
    if project.status == "archived":
        session.close()
        raise HTTPException(status_code=400, detail="Cannot file issues in an archived project")
    if payload.assignee_id is not None and not _is_member(session, project.id, payload.assignee_id):
        session.close()
        raise HTTPException(status_code=400, detail="Assignee is not a member of this project")
    now = now_utc()
    issue = Issue(
        project_id=project.id,
        title=payload.title.strip(),
        description=payload.description,
        status="open",
        priority=payload.priority,
        reporter_id=CURRENT_USER_ID,
        assignee_id=payload.assignee_id,
        due_date=payload.due_date,
        created_at=now,
        updated_at=now,
    )
    session.add(issue)
    session.commit()
    session.refresh(issue)
    result = IssueModel.model_validate(issue)
    session.close()
    return result


@app.patch(
    "/api/issues/{issue_id}",
    response_model=IssueModel,
    summary="Update an issue",
    description="Change the title, description, status, priority or due date of an issue. Fields left out stay unchanged.",
    tags=["issues"],
    operation_id="update_issue",
)
async def update_issue(
    issue_id: int = Path(..., description="Issue ID.", examples=[12]),
    payload: IssueUpdateBody = Body(..., description="Fields to change."),
) -> IssueModel:
    session = SessionLocal()
    issue = session.query(Issue).filter(Issue.id == issue_id).first()
    if issue is None:
        session.close()
        raise HTTPException(status_code=404, detail="Issue not found")
    changes = payload.model_dump(exclude_unset=True)
    if not changes:
        session.close()
        raise HTTPException(status_code=400, detail="No fields to update")
    for field, value in changes.items():
        if field == "title" and value is not None:
            value = value.strip()
        if field in ("title", "status", "priority") and value is None:
            continue
        setattr(issue, field, value)
    issue.updated_at = now_utc()
    session.commit()
    session.refresh(issue)
    result = IssueModel.model_validate(issue)
    session.close()
    return result


@app.put(
    "/api/issues/{issue_id}/assignee",
    response_model=IssueModel,
    summary="Assign an issue",
    description="Set the assignee of an issue to a project member, or clear it with a null assignee_id.",
    tags=["issues", "assignments"],
    operation_id="assign_issue",
)
async def assign_issue(
    issue_id: int = Path(..., description="Issue ID.", examples=[2]),
    payload: AssignBody = Body(..., description="New assignee."),
) -> IssueModel:
    session = SessionLocal()
    issue = session.query(Issue).filter(Issue.id == issue_id).first()
    if issue is None:
        session.close()
        raise HTTPException(status_code=404, detail="Issue not found")
    if payload.assignee_id is not None:
        if session.query(User).filter(User.id == payload.assignee_id).first() is None:
            session.close()
            raise HTTPException(status_code=404, detail="User not found")
        if not _is_member(session, issue.project_id, payload.assignee_id):
            session.close()
            raise HTTPException(status_code=400, detail="Assignee is not a member of this project")
    issue.assignee_id = payload.assignee_id
    issue.updated_at = now_utc()
    session.commit()
    session.refresh(issue)
    result = IssueModel.model_validate(issue)
    session.close()
    return result


@app.delete(
    "/api/issues/{issue_id}",
    response_model=StatusResponse,
    summary="Delete an issue",
    description="Permanently delete an issue together with its comments and label links.",
    tags=["issues"],
    operation_id="delete_issue",
)
async def delete_issue(
    issue_id: int = Path(..., description="Issue ID.", examples=[14]),
) -> StatusResponse:
    session = SessionLocal()
    issue = session.query(Issue).filter(Issue.id == issue_id).first()
    if issue is None:
        session.close()
        raise HTTPException(status_code=404, detail="Issue not found")
    session.query(Comment).filter(Comment.issue_id == issue_id).delete(synchronize_session=False)
    session.query(IssueLabel).filter(IssueLabel.issue_id == issue_id).delete(synchronize_session=False)
    session.delete(issue)
    session.commit()
    session.close()
    return StatusResponse(success=True, message=f"Issue {issue_id} deleted")


# ---------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------


@app.get(
    "/api/projects/{project_id}/labels",
    response_model=LabelListResponse,
    summary="List project labels",
    description="List the labels defined in a project. Labels are per project: two projects may each have a label with the same name.",
    tags=["labels"],
    operation_id="list_project_labels",
)
async def list_project_labels(
    project_id: int = Path(..., description="Project ID.", examples=[2]),
) -> LabelListResponse:
    session = SessionLocal()
    if session.query(Project).filter(Project.id == project_id).first() is None:
        session.close()
        raise HTTPException(status_code=404, detail="Project not found")
    labels = [
        LabelModel.model_validate(lb)
        for lb in session.query(Label).filter(Label.project_id == project_id).order_by(Label.name.asc()).all()
    ]
    session.close()
    return LabelListResponse(labels=labels)


@app.post(
    "/api/projects/{project_id}/labels",
    response_model=LabelModel,
    summary="Create a label",
    description="Create a new label in a project. Label names are unique within a project.",
    tags=["labels"],
    operation_id="create_label",
)
async def create_label(
    project_id: int = Path(..., description="Project ID.", examples=[1]),
    payload: LabelCreateBody = Body(..., description="Label name and colour."),
) -> LabelModel:
    session = SessionLocal()
    if session.query(Project).filter(Project.id == project_id).first() is None:
        session.close()
        raise HTTPException(status_code=404, detail="Project not found")
    name = payload.name.strip()
    existing = session.query(Label).filter(Label.project_id == project_id, Label.name == name).first()
    if existing is not None:
        session.close()
        raise HTTPException(status_code=409, detail="A label with this name already exists in the project")
    label = Label(project_id=project_id, name=name, color=payload.color.lower(), created_at=now_utc())
    session.add(label)
    session.commit()
    session.refresh(label)
    result = LabelModel.model_validate(label)
    session.close()
    return result


@app.post(
    "/api/issues/{issue_id}/labels",
    response_model=IssueLabelResponse,
    summary="Add a label to an issue",
    description="Attach an existing label of the same project to an issue.",
    tags=["labels", "issues"],
    operation_id="add_label_to_issue",
)
async def add_label_to_issue(
    issue_id: int = Path(..., description="Issue ID.", examples=[7]),
    payload: IssueLabelBody = Body(..., description="Label to attach."),
) -> IssueLabelResponse:
    session = SessionLocal()
    issue = session.query(Issue).filter(Issue.id == issue_id).first()
    if issue is None:
        session.close()
        raise HTTPException(status_code=404, detail="Issue not found")
    label = session.query(Label).filter(Label.id == payload.label_id).first()
    if label is None:
        session.close()
        raise HTTPException(status_code=404, detail="Label not found")
    if label.project_id != issue.project_id:
        session.close()
        raise HTTPException(status_code=400, detail="Label belongs to a different project")
    existing = (
        session.query(IssueLabel)
        .filter(IssueLabel.issue_id == issue_id, IssueLabel.label_id == payload.label_id)
        .first()
    )
    if existing is not None:
        session.close()
        raise HTTPException(status_code=409, detail="Label already on this issue")
    session.add(IssueLabel(issue_id=issue_id, label_id=payload.label_id, added_at=now_utc()))
    issue.updated_at = now_utc()
    session.commit()
    result = IssueLabelResponse(issue_id=issue_id, labels=_labels_of_issue(session, issue_id))
    session.close()
    return result


@app.delete(
    "/api/issues/{issue_id}/labels/{label_id}",
    response_model=IssueLabelResponse,
    summary="Remove a label from an issue",
    description="Detach a label from an issue. The label itself is kept in the project.",
    tags=["labels", "issues"],
    operation_id="remove_label_from_issue",
)
async def remove_label_from_issue(
    issue_id: int = Path(..., description="Issue ID.", examples=[2]),
    label_id: int = Path(..., description="Label ID.", examples=[2]),
) -> IssueLabelResponse:
    session = SessionLocal()
    link = (
        session.query(IssueLabel)
        .filter(IssueLabel.issue_id == issue_id, IssueLabel.label_id == label_id)
        .first()
    )
    if link is None:
        session.close()
        raise HTTPException(status_code=404, detail="Label is not on this issue")
    session.delete(link)
    issue = session.query(Issue).filter(Issue.id == issue_id).first()
    if issue is not None:
        issue.updated_at = now_utc()
    session.commit()
    result = IssueLabelResponse(issue_id=issue_id, labels=_labels_of_issue(session, issue_id))
    session.close()
    return result


# ---------------------------------------------------------------------------
# Comments
# ---------------------------------------------------------------------------


@app.get(
    "/api/issues/{issue_id}/comments",
    response_model=CommentListResponse,
    summary="List issue comments",
    description="List the comments on an issue, oldest first.",
    tags=["comments"],
    operation_id="list_issue_comments",
)
async def list_issue_comments(
    issue_id: int = Path(..., description="Issue ID.", examples=[11]),
) -> CommentListResponse:
    session = SessionLocal()
    if session.query(Issue).filter(Issue.id == issue_id).first() is None:
        session.close()
        raise HTTPException(status_code=404, detail="Issue not found")
    comments = [
        CommentModel.model_validate(c)
        for c in session.query(Comment)
        .filter(Comment.issue_id == issue_id)
        .order_by(Comment.created_at.asc(), Comment.id.asc())
        .all()
    ]
    session.close()
    return CommentListResponse(comments=comments)


@app.post(
    "/api/issues/{issue_id}/comments",
    response_model=CommentModel,
    summary="Comment on an issue",
    description="Add a comment to an issue as the current user.",
    tags=["comments"],
    operation_id="add_comment",
)
async def add_comment(
    issue_id: int = Path(..., description="Issue ID.", examples=[12]),
    payload: CommentCreateBody = Body(..., description="Comment text."),
) -> CommentModel:
    session = SessionLocal()
    issue = session.query(Issue).filter(Issue.id == issue_id).first()
    if issue is None:
        session.close()
        raise HTTPException(status_code=404, detail="Issue not found")
    comment = Comment(issue_id=issue_id, author_id=CURRENT_USER_ID, body=payload.body.strip(), created_at=now_utc())
    session.add(comment)
    session.commit()
    session.refresh(comment)
    result = CommentModel.model_validate(comment)
    session.close()
    return result


@app.delete(
    "/api/comments/{comment_id}",
    response_model=StatusResponse,
    summary="Delete a comment",
    description="Delete one of the current user's own comments.",
    tags=["comments"],
    operation_id="delete_comment",
)
async def delete_comment(
    comment_id: int = Path(..., description="Comment ID.", examples=[7]),
) -> StatusResponse:
    session = SessionLocal()
    comment = session.query(Comment).filter(Comment.id == comment_id).first()
    if comment is None:
        session.close()
        raise HTTPException(status_code=404, detail="Comment not found")
    if comment.author_id != CURRENT_USER_ID:
        session.close()
        raise HTTPException(status_code=400, detail="You can only delete your own comments")
    session.delete(comment)
    session.commit()
    session.close()
    return StatusResponse(success=True, message=f"Comment {comment_id} deleted")


if __name__ == "__main__":
    import uvicorn

    host = os.getenv("HOST", "127.0.0.1")
    port = int(os.getenv("PORT", "8000"))
    uvicorn.run(app, host=host, port=port)
